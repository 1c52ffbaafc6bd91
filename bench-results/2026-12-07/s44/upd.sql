\timing off
SET plan_cache_mode = force_generic_plan;
PREPARE u(uuid[], integer[], integer[], text[], bigint[], bigint[], uuid[], text[], bigint[], bigint[], bigint[], bigint[], bigint[], text[], text[], bigint[], text[], bigint[], bigint[], bigint[], text[], text[], bigint[], bigint[], text[], bigint[], text[]) AS
UPDATE steps SET priority = v.priority, state = v.state, attempt = v.attempt,
  failures = v.failures, lease_id = v.lease_id, worker = v.worker, ready_at = v.ready_at,
  started_at = v.started_at, finished_at = v.finished_at, lease_expires_at = v.lease_expires_at,
  next_attempt_at = v.next_attempt_at, result = v.result, last_error = v.last_error,
  budget_from = v.budget_from, comp_phase = v.comp_phase, comp_attempts = v.comp_attempts,
  comp_failures = v.comp_failures, comp_budget_from = v.comp_budget_from,
  claim_agent = v.claim_agent, lease_agent = v.lease_agent, claim_rank = v.claim_rank,
  attempt_ends_at = v.attempt_ends_at, progress = v.progress, progress_at = v.progress_at,
  unlogged_entry = v.unlogged_entry
FROM (SELECT unnest($1::uuid[]) AS job_id, unnest($2::integer[]) AS idx, unnest($3::integer[]) AS priority, unnest($4::text[]) AS state, unnest($5::bigint[]) AS attempt, unnest($6::bigint[]) AS failures, unnest($7::uuid[]) AS lease_id, unnest($8::text[]) AS worker, unnest($9::bigint[]) AS ready_at, unnest($10::bigint[]) AS started_at, unnest($11::bigint[]) AS finished_at, unnest($12::bigint[]) AS lease_expires_at, unnest($13::bigint[]) AS next_attempt_at, unnest($14::text[]) AS result, unnest($15::text[]) AS last_error, unnest($16::bigint[]) AS budget_from, unnest($17::text[]) AS comp_phase, unnest($18::bigint[]) AS comp_attempts, unnest($19::bigint[]) AS comp_failures, unnest($20::bigint[]) AS comp_budget_from, unnest($21::text[]) AS claim_agent, unnest($22::text[]) AS lease_agent, unnest($23::bigint[]) AS claim_rank, unnest($24::bigint[]) AS attempt_ends_at, unnest($25::text[]) AS progress, unnest($26::bigint[]) AS progress_at, unnest($27::text[]) AS unlogged_entry) v
WHERE steps.job_id = v.job_id AND steps.idx = v.idx AND steps.job_id = ANY($1::uuid[]);
SELECT array_agg(job_id) a1, array_agg(idx) a2, array_agg(priority) a3, array_agg('running'::text) a4, array_agg(attempt+1) a5, array_agg(failures) a6, array_agg(gen_random_uuid()) a7, array_agg('w1'::text) a8, array_agg(ready_at) a9, array_agg(started_at) a10, array_agg(NULL::bigint) a11, array_agg(99999999999::bigint) a12, array_agg(next_attempt_at) a13, array_agg(NULL::text) a14, array_agg(NULL::text) a15, array_agg(budget_from) a16, array_agg(comp_phase) a17, array_agg(comp_attempts) a18, array_agg(comp_failures) a19, array_agg(comp_budget_from) a20, array_agg(NULL::text) a21, array_agg('bench'::text) a22, array_agg(NULL::bigint) a23, array_agg(attempt_ends_at) a24, array_agg(progress) a25, array_agg(progress_at) a26, array_agg(NULL::text) a27 FROM (SELECT * FROM steps ORDER BY job_id OFFSET :off LIMIT 47) x \gset
BEGIN;
EXPLAIN (ANALYZE, BUFFERS, WAL, COSTS OFF) EXECUTE u(:'a1', :'a2', :'a3', :'a4', :'a5', :'a6', :'a7', :'a8', :'a9', :'a10', :'a11', :'a12', :'a13', :'a14', :'a15', :'a16', :'a17', :'a18', :'a19', :'a20', :'a21', :'a22', :'a23', :'a24', :'a25', :'a26', :'a27');
ROLLBACK;
