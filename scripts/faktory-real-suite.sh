#!/usr/bin/env bash
# Runs the published `faktory` Rust client crate's own real-server test suite
# (tests/real/community.rs) against `overseer server --faktory-listen`.
#
# What it does:
#   1. builds `overseer` (release) into $OVERSEER_TARGET_DIR;
#   2. starts `overseer server` on a throw-away SQLite store, a free HTTP port and a free
#      Faktory port;
#   3. copies the faktory crate's source from the cargo registry into a temp dir (never into
#      this repository) and runs `cargo test --test real -- --test-threads=1` there with
#      FAKTORY_URL pointing at the server, then, in a second run, the suite's one ignored test
#      (`queue_control_actions_wildcard`, which pauses/removes *every* queue and so wants a run
#      of its own);
#   4. stops the server and removes the temp dirs.
#
# Tests that need Docker (TESTCONTAINERS_ENABLED), TLS or Faktory Enterprise (FAKTORY_ENT,
# feature `ent`) skip themselves: those variables are left unset.
#
# Usage: scripts/faktory-real-suite.sh [extra args for the test binary, e.g. a test name]
# Environment:
#   FAKTORY_CRATE_VERSION  (default 0.13.1)
#   OVERSEER_TARGET_DIR    target dir for overseer (default: this repository's target/)
#   SUITE_TARGET_DIR       target dir for the copied crate (default target/faktory-suite)
#   SUITE_THREADS          test threads for the main run (default 1: the suite shares one server
#                          and its MUTATE tests with empty filters reach other tests' jobs)
#   KEEP_SERVER_LOG=1      keep the server log (its path is printed)
set -euo pipefail

version="${FAKTORY_CRATE_VERSION:-0.13.1}"
repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
overseer_target="${OVERSEER_TARGET_DIR:-$repo/target}"
suite_target="${SUITE_TARGET_DIR:-$repo/target/faktory-suite}"

crate_src=""
for d in "${CARGO_HOME:-$HOME/.cargo}"/registry/src/*/faktory-"$version"; do
  [ -d "$d" ] && crate_src="$d"
done
if [ -z "$crate_src" ]; then
  echo "faktory-$version is not in the cargo registry; fetch it first (e.g. cargo fetch in crates/faktory)" >&2
  exit 2
fi

echo "==> building overseer (release) into $overseer_target" >&2
(cd "$repo" && CARGO_TARGET_DIR="$overseer_target" cargo build --release -p overseer --quiet)
overseer="$overseer_target/release/overseer"

work="$(mktemp -d -t faktory-real-suite.XXXXXX)"
server_pid=""
cleanup() {
  if [ -n "$server_pid" ] && kill -0 "$server_pid" 2>/dev/null; then
    kill "$server_pid" 2>/dev/null || true
    wait "$server_pid" 2>/dev/null || true
  fi
  if [ "${KEEP_SERVER_LOG:-}" = 1 ]; then
    echo "server log kept at $work/server.log" >&2
  else
    rm -rf "$work"
  fi
}
trap cleanup EXIT

free_port() {
  python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1]); s.close()'
}
http_port="$(free_port)"
faktory_port="$(free_port)"
while [ "$faktory_port" = "$http_port" ]; do faktory_port="$(free_port)"; done

echo "==> starting overseer server (http :$http_port, faktory :$faktory_port)" >&2
"$overseer" server \
  --db "sqlite://$work/overseer.db" \
  --listen "127.0.0.1:$http_port" \
  --faktory-listen "127.0.0.1:$faktory_port" \
  >"$work/server.log" 2>&1 &
server_pid=$!
for _ in $(seq 1 100); do
  if curl -fsS "http://127.0.0.1:$http_port/readyz" >/dev/null 2>&1; then break; fi
  if ! kill -0 "$server_pid" 2>/dev/null; then
    echo "overseer server exited early:" >&2
    cat "$work/server.log" >&2
    exit 1
  fi
  sleep 0.1
done
curl -fsS "http://127.0.0.1:$http_port/readyz" >/dev/null

echo "==> copying $crate_src to $work" >&2
cp -r "$crate_src" "$work/faktory"

export FAKTORY_URL="tcp://127.0.0.1:$faktory_port"
unset TESTCONTAINERS_ENABLED FAKTORY_ENT
status=0
threads="${SUITE_THREADS:-1}"
echo "==> cargo test --test real -- --test-threads=$threads (FAKTORY_URL=$FAKTORY_URL)" >&2
(cd "$work/faktory" && CARGO_TARGET_DIR="$suite_target" \
  cargo test --locked --test real -- --test-threads="$threads" "$@") || status=$?

if [ $# -eq 0 ]; then
  echo "==> cargo test --test real queue_control_actions_wildcard -- --include-ignored" >&2
  (cd "$work/faktory" && CARGO_TARGET_DIR="$suite_target" \
    cargo test --locked --test real queue_control_actions_wildcard -- --include-ignored --test-threads=1) || status=$?
fi

if [ $status -ne 0 ]; then
  echo "==> the suite failed; last lines of the server log:" >&2
  tail -n 40 "$work/server.log" >&2
fi
exit $status
