#!/bin/sh
# Creates the site's storage bucket. Runs in parallel with dns.
cat >/dev/null
echo "storage: creating bucket (key $OVERSEER_IDEMPOTENCY_KEY)" >&2
sleep "${EXAMPLE_STEP_SECONDS:-2}"
echo '{"bucket_url": "s3://acme-site"}'
