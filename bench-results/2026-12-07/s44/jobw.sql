SET plan_cache_mode = force_generic_plan;
SET enable_seqscan = off;
PREPARE a(uuid[], bigint[]) AS UPDATE jobs SET updated_at = v.updated_at FROM (SELECT unnest($1::uuid[]) AS id, unnest($2::bigint[]) AS updated_at) v WHERE jobs.id = v.id AND jobs.id = ANY($1::uuid[]);
PREPARE b(uuid[], bigint[]) AS UPDATE jobs SET updated_at = v.updated_at FROM (SELECT unnest($1::uuid[]) AS id, unnest($2::bigint[]) AS updated_at) v WHERE jobs.id = v.id;
SELECT array_agg(id) a1, array_agg(updated_at+1) a2 FROM (SELECT * FROM jobs ORDER BY id OFFSET :off LIMIT :n) x \gset
BEGIN;
EXPLAIN (ANALYZE, COSTS OFF) EXECUTE a(:'a1', :'a2');
ROLLBACK;
BEGIN;
EXPLAIN (ANALYZE, COSTS OFF) EXECUTE b(:'a1', :'a2');
ROLLBACK;
