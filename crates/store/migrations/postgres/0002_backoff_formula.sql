-- Retry delay formulas: `backoff_formula` names the curve a step's retries follow when it is not
-- the exponential `backoff_*` one (`faktory` for jobs pushed over the Faktory protocol). NULL
-- means exponential, which is what every step written before this migration used.

ALTER TABLE steps ADD COLUMN backoff_formula text;
