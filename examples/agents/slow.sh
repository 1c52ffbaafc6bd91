#!/bin/sh
# Takes ten seconds: long enough to kill its agent, or to cancel the job, while it runs.
cat >/dev/null
echo "slow: attempt $OVERSEER_ATTEMPT of $OVERSEER_STEP working for 10 s" >&2
sleep 10
echo '"slow done"'
