#!/usr/bin/env bash
# Builds the TypeScript SDK (sdks/typescript) and runs its node:test suite against real
# `overseer server` processes started by the tests from the binary named by OVERSEER_BIN.
# Needs Node.js >= 20 with npm. Dev dependencies come from the committed package-lock.json
# (`npm ci`, preferring npm's cache); they are installed again only when the lock file changed,
# so re-runs take seconds. Usage: OVERSEER_BIN=target/debug/overseer scripts/test-sdk-typescript.sh
set -euo pipefail
sdk="$(cd "$(dirname "${BASH_SOURCE[0]}")/../sdks/typescript" && pwd)"
: "${OVERSEER_BIN:?set OVERSEER_BIN to the overseer binary the tests should start}"
OVERSEER_BIN="$(cd "$(dirname "$OVERSEER_BIN")" && pwd)/$(basename "$OVERSEER_BIN")"
export OVERSEER_BIN

major="$(node -p 'process.versions.node.split(".")[0]' 2>/dev/null || echo 0)"
if [ "$major" -lt 20 ]; then
  echo "the TypeScript SDK needs Node.js >= 20 (found: $(node --version 2>/dev/null || echo none))" >&2
  exit 1
fi

cd "$sdk"
# npm ci leaves node_modules/.package-lock.json behind: it is newer than the lock file unless
# the lock file changed since.
if [ ! -f node_modules/.package-lock.json ] || [ package-lock.json -nt node_modules/.package-lock.json ]; then
  npm ci --prefer-offline --no-audit --no-fund --loglevel=error
fi
# A clean build, so a test file deleted from test/ cannot linger in dist/.
rm -rf dist
npm run build --silent
node --test dist/test/*.test.js
