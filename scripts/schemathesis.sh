#!/usr/bin/env bash
# Fuzzes the live HTTP API against its own OpenAPI document with schemathesis: every operation
# of GET /openapi.json, generated requests (valid and invalid, and chains that follow the
# document's links), and six checks on every answer: no server error (5xx), a documented status
# code, a documented content type (problem+json for errors), a body that matches the documented
# schema, schema-valid requests accepted and schema-violating ones refused (the few rules a
# schema cannot say are listed in scripts/schemathesis.toml). The live event stream is left out:
# it never ends, so there is no body to check. SCHEMATHESIS_CHECKS overrides the check list.
#
# Usage: OVERSEER_BIN=path/to/overseer scripts/schemathesis.sh
# Installs schemathesis (pinned) into a venv under the cargo target directory on first use; runs
# a server of its own on a free loopback port with auth required and long-polls capped at 1 s
# so generated waits stay short. Exits non-zero on any failure or error.
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
TARGET="${CARGO_TARGET_DIR:-$ROOT/target}"
VENV="$TARGET/venv-schemathesis"
VERSION="4.32.5"
BIN="${OVERSEER_BIN:-$TARGET/debug/overseer}"
EXAMPLES="${SCHEMATHESIS_MAX_EXAMPLES:-10}"
CHECKS="${SCHEMATHESIS_CHECKS:-not_a_server_error,status_code_conformance,content_type_conformance,response_schema_conformance,positive_data_acceptance,negative_data_rejection}"

if [ ! -x "$VENV/bin/schemathesis" ] || ! "$VENV/bin/schemathesis" --version | grep -q "$VERSION"; then
  python3 -m venv "$VENV"
  "$VENV/bin/pip" install --quiet --disable-pip-version-check "schemathesis==$VERSION"
fi

WORK="$(mktemp -d)"
SERVER_PID=""
cleanup() {
  if [ -n "$SERVER_PID" ]; then kill "$SERVER_PID" 2>/dev/null || true; wait "$SERVER_PID" 2>/dev/null || true; fi
  rm -rf "$WORK"
}
trap cleanup EXIT

ADMIN="schemathesis-admin-$(head -c 16 /dev/urandom | od -An -tx1 | tr -d ' \n')"
cat > "$WORK/overseer.toml" <<TOML
lease_wait_default = "500ms"
[limits]
wait_max = "1s"
TOML
OVERSEER_ADMIN_TOKEN="$ADMIN" RUST_LOG=warn "$BIN" server \
  --db "sqlite://$WORK/overseer.db" --listen 127.0.0.1:0 --auth required \
  --config "$WORK/overseer.toml" --ready-file "$WORK/ready" 2> "$WORK/server.log" &
SERVER_PID=$!
for _ in $(seq 1 200); do [ -s "$WORK/ready" ] && break; sleep 0.05; done
ADDR="$(cat "$WORK/ready")"

cd "$WORK"
status=0
"$VENV/bin/schemathesis" --config-file "$ROOT/scripts/schemathesis.toml" run "http://$ADDR/openapi.json" \
  --header "Authorization: Bearer $ADMIN" \
  --checks "$CHECKS" \
  --exclude-path /v1/events/stream \
  --max-examples "$EXAMPLES" --request-timeout 10 --seed 1 --no-color > "$WORK/report.txt" 2>&1 || status=$?
# The warnings (operations the run could not reach far into) and the summary: operations,
# cases, failures, errors.
sed -n '/= WARNINGS =/,/= SUMMARY =/p' "$WORK/report.txt" | sed '$d'
sed -n '/SUMMARY/,$p' "$WORK/report.txt"
if [ "$status" -ne 0 ]; then
  cat "$WORK/report.txt"
  echo "--- server log ---"; tail -50 "$WORK/server.log"
fi
if grep -qi "panicked" "$WORK/server.log"; then
  echo "the server panicked:"; grep -i -A5 panicked "$WORK/server.log"; exit 1
fi
exit "$status"
