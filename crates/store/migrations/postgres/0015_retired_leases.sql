-- A step row names its latest lease (`steps.lease_id`), and a lease id is looked up there first,
-- by a new index. `leases` keeps only the leases taken off their steps (a retry's new attempt, an
-- unwind, a new round), so that a late report on one is still fenced as stale, not answered as
-- unknown. A first attempt's claim, nearly every claim, writes no lease row at all.
CREATE INDEX steps_lease_id ON steps (lease_id) WHERE lease_id IS NOT NULL;
DELETE FROM leases USING steps WHERE steps.lease_id = leases.lease_id;
ALTER TABLE leases DROP COLUMN worker, DROP COLUMN leased_at;
