-- HTTP targets: `http` holds the target (URL, method, headers, timeout, async) of a step the
-- server calls itself, as JSON; NULL for a step run by an agent pool, which is every step written
-- before this migration.

ALTER TABLE steps ADD COLUMN http text;
