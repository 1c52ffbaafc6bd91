#!/bin/sh
# Points the customer's domain at the site. Runs in parallel with storage.
cat >/dev/null
echo "dns: creating records (key $OVERSEER_IDEMPOTENCY_KEY)" >&2
sleep "${EXAMPLE_STEP_SECONDS:-2}"
echo '{"records": ["A", "AAAA", "TXT"]}'
