-- `steps_claim_due` answers two questions: which agents to wake when a retry's backoff ends, and
-- when the supervisor next has such a retry to act on. A step that was claimable from the moment
-- it became ready (its `next_attempt_at` equals its `ready_at`: new work, a promoted dependant, an
-- undo just started) is in neither answer: the transition that made it ready woke its agent. So
-- only steps that wait beyond their readiness (a backoff) are kept in it. Every other claimable
-- step used to enter it at submit or promotion and leave it at its claim: two index writes per
-- step that no query read.
DROP INDEX steps_claim_due;
CREATE INDEX steps_claim_due ON steps (next_attempt_at)
    WHERE claim_agent IS NOT NULL AND next_attempt_at > ready_at;
