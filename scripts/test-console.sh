#!/bin/sh
# Browser tests of the operator console: installs Debian's Chromium if missing (CI runs as
# root), installs playwright-core from the committed package-lock.json without any browser
# download, then runs console-tests/ with Node's test runner against $OVERSEER_BIN.
set -eu
cd "$(dirname "$0")/../console-tests"
if [ ! -x /usr/bin/chromium ]; then
  if [ "$(id -u)" != 0 ]; then
    echo "test-console: /usr/bin/chromium is missing; install Debian's chromium package (apt-get install -y chromium)" >&2
    exit 1
  fi
  apt-get update
  DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends chromium
fi
if ! command -v npm >/dev/null; then
  [ "$(id -u)" = 0 ] || { echo "test-console: node and npm are missing (apt-get install -y nodejs npm)" >&2; exit 1; }
  apt-get update
  DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends nodejs npm
fi
export PLAYWRIGHT_SKIP_BROWSER_DOWNLOAD=1
if [ ! -d node_modules/playwright-core ]; then
  npm ci --no-audit --no-fund
fi
exec node --test tests/console.test.js
