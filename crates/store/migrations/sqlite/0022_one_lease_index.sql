-- One index of live leases instead of two: `steps_lease_agent` (the leases of one agent, which
-- concurrency limits count) and `steps_lease_expiry` (all leases by expiry, which the leader's
-- sweep walks) become `steps_lease_expiry` on (lease_agent, lease_expires_at, job_id, idx). A
-- claim and a report each write one index entry fewer; the sweep and the supervisor's next
-- wake-up walk the agents holding leases (a few) and each agent's leases by expiry.
DROP INDEX steps_lease_agent;
DROP INDEX steps_lease_expiry;
CREATE INDEX steps_lease_expiry ON steps (lease_agent, lease_expires_at, job_id, idx)
    WHERE lease_expires_at IS NOT NULL;
