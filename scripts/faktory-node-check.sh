#!/usr/bin/env bash
# Runs scripts/faktory-node/check.js, a round trip with the Node Faktory client
# (faktory-worker, from the npm registry) against a fresh `overseer server --faktory-listen`.
# Needs node and npm. Usage: scripts/faktory-node-check.sh
set -euo pipefail
repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
work="$(mktemp -d)"
server_pid=""
cleanup() {
  [ -n "$server_pid" ] && kill "$server_pid" 2>/dev/null && wait "$server_pid" 2>/dev/null || true
  rm -rf "$work"
}
trap cleanup EXIT
cargo build --release --bin overseer --manifest-path "$repo/Cargo.toml" >&2
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
http_port="$(free_port)"
fk_port="$(free_port)"
"$repo/target/release/overseer" server --db "sqlite://$work/overseer.db" \
  --listen "127.0.0.1:$http_port" --faktory-listen "127.0.0.1:$fk_port" > "$work/server.log" 2>&1 &
server_pid=$!
for _ in $(seq 1 100); do
  curl -sf "http://127.0.0.1:$http_port/readyz" > /dev/null && break
  sleep 0.1
done
cp "$repo/scripts/faktory-node/check.js" "$repo/scripts/faktory-node/package.json" "$work/"
(cd "$work" && npm install --silent --no-audit --no-fund > /dev/null)
FAKTORY_URL="tcp://127.0.0.1:$fk_port" node "$work/check.js"
