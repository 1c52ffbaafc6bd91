#!/bin/sh
# Fails its first two attempts, then succeeds: watch the retries and backoff with
# `overseer submit examples/flaky.json --wait`.
cat >/dev/null
if [ "$OVERSEER_ATTEMPT" -lt 3 ]; then
  echo "flaky: attempt $OVERSEER_ATTEMPT failing on purpose" >&2
  exit 1
fi
echo '"third time lucky"'
