-- Jobs by the time they finished, for the per-minute counts of `GET /v1/stats`: a window of the
-- last hour reads only the jobs finished in it.

CREATE INDEX jobs_finished ON jobs (finished_at, state) WHERE finished_at IS NOT NULL;
