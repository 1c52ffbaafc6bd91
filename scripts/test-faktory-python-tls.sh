#!/usr/bin/env bash
# Runs scripts/faktory-python-tls.py (the published Python `faktory` package, producer and
# worker, over tcp+tls://) against a Faktory listener the caller started.
#
# Usage: FAKTORY_URL=tcp+tls://127.0.0.1:PORT FAKTORY_CA=ca.pem FAKTORY_WRONG_CA=other.pem \
#          scripts/test-faktory-python-tls.sh
# Installs the package (pinned) into a venv under the cargo target directory on first use and
# reuses it afterwards.
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
TARGET="${CARGO_TARGET_DIR:-$ROOT/target}"
case "$TARGET" in /*) ;; *) TARGET="$ROOT/$TARGET" ;; esac
VENV="$TARGET/venv-faktory-python"
VERSION="1.0.0"
export PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_NO_INPUT=1 PYTHONDONTWRITEBYTECODE=1

if [ "$("$VENV/bin/python" -c 'import importlib.metadata as m; print(m.version("faktory"))' 2>/dev/null)" != "$VERSION" ]; then
  rm -rf "$VENV"
  python3 -m venv "$VENV"
  "$VENV/bin/pip" install --quiet "faktory==$VERSION"
fi
# The package's ssl.wrap_socket is deprecated on 3.11; the warning is expected, not news.
exec "$VENV/bin/python" -W ignore::DeprecationWarning "$ROOT/scripts/faktory-python-tls.py"
