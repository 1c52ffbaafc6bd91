-- The name of the token that submitted each job (NULL without auth, for the admin setting, and
-- for jobs the server makes itself), so a `submit`-only token reads only its own jobs.

ALTER TABLE jobs ADD COLUMN submitted_by TEXT;
