-- The same index names on both backends: two SQLite indexes are renamed to what PostgreSQL calls
-- them (SQLite cannot rename an index: each is dropped and made again, identical).

DROP INDEX steps_claim_rank;
CREATE INDEX steps_claim ON steps (claim_agent, claim_rank, job_id, idx)
    WHERE claim_agent IS NOT NULL;

DROP INDEX jobs_ordering;
CREATE INDEX jobs_ordering_key ON jobs (ordering_key, seq)
    WHERE ordering_key IS NOT NULL AND state NOT IN ('succeeded', 'failed', 'cancelled');
