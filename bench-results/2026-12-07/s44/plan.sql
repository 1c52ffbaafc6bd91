BEGIN; SET LOCAL enable_seqscan = off; SET LOCAL plan_cache_mode = force_generic_plan;
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
WHERE steps.job_id = v.job_id AND steps.idx = v.idx;
PREPARE u2(uuid[], integer[], integer[], text[], bigint[], bigint[], uuid[], text[], bigint[], bigint[], bigint[], bigint[], bigint[], text[], text[], bigint[], text[], bigint[], bigint[], bigint[], text[], text[], bigint[], bigint[], text[], bigint[], text[]) AS
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
EXPLAIN (COSTS OFF) EXECUTE u(NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL);
EXPLAIN (COSTS OFF) EXECUTE u2(NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL);
ROLLBACK;
