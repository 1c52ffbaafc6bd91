#!/bin/sh
# Creates the customer's account. The lease JSON arrives on stdin; whatever we print on stdout
# becomes the step's result (JSON if it parses). Exit 0 means success.
lease=$(cat)
echo "accounts: creating account for job $OVERSEER_JOB_ID (attempt $OVERSEER_ATTEMPT)" >&2
sleep "${EXAMPLE_STEP_SECONDS:-1}"
# A real agent would pass OVERSEER_IDEMPOTENCY_KEY to the remote service so a retried attempt
# cannot create a second account.
printf '{"account_id": "acct-%s", "bytes_of_lease": %s}\n' "$(echo "$OVERSEER_JOB_ID" | cut -c1-8)" "${#lease}"
