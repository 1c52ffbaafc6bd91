#!/usr/bin/env bash
# Runs the Python SDK's pytest suite (sdks/python/tests) against a real overseer binary.
#
# Creates a venv under ${CARGO_TARGET_DIR:-target}/sdk-venv-python with the pinned test
# requirements and the SDK itself, reusing it while neither changed (a re-run costs a few
# hundred milliseconds before pytest). Usage:
#   OVERSEER_BIN=target/debug/overseer scripts/test-sdk-python.sh [pytest args...]
# Without OVERSEER_BIN it builds the debug binary first. Needs python3 >= 3.9 with venv; as
# root on Debian it installs python3-venv itself when that is missing.
set -euo pipefail
repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
sdk="$repo/sdks/python"
target="${CARGO_TARGET_DIR:-$repo/target}"
case "$target" in /*) ;; *) target="$repo/$target" ;; esac
venv="$target/sdk-venv-python"
export PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_NO_INPUT=1 PYTHONDONTWRITEBYTECODE=1

ensure_python() {
  if command -v python3 >/dev/null && python3 -c 'import ensurepip, venv' 2>/dev/null; then
    return
  fi
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
    echo "installing python3 and python3-venv with apt-get" >&2
    apt-get update -qq >&2
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq python3 python3-venv >&2
  else
    echo "python3 with the venv module is required (Debian: apt-get install python3-venv)" >&2
    exit 1
  fi
}

# A fingerprint of everything the venv is built from: rebuilt only when it changes.
fingerprint() {
  {
    python3 -c 'import sys; print(sys.version)'
    cat "$sdk/requirements-test.txt" "$sdk/pyproject.toml"
    find "$sdk/src" -type f -name '*.py' -o -type f -name 'py.typed' | LC_ALL=C sort | xargs cat
  } | sha256sum | cut -d' ' -f1
}

ensure_python
python3 -c 'import sys; sys.exit(sys.version_info < (3, 9))' || {
  echo "the Python SDK needs Python >= 3.9" >&2
  exit 1
}
stamp="$venv/.overseer-stamp"
want="$(fingerprint)"
if [ "$(cat "$stamp" 2>/dev/null)" != "$want" ]; then
  rm -rf "$venv"
  python3 -m venv "$venv"
  "$venv/bin/pip" install -q -r "$sdk/requirements-test.txt"
  # Built in a copy so that the source tree gets no build/ or egg-info directories.
  build="$(mktemp -d)"
  trap 'rm -rf "$build"' EXIT
  cp -r "$sdk/pyproject.toml" "$sdk/README.md" "$sdk/src" "$build/"
  "$venv/bin/pip" install -q --no-deps --no-build-isolation "$build"
  echo "$want" > "$stamp"
fi

if [ -z "${OVERSEER_BIN:-}" ]; then
  cargo build -q -p overseer --bin overseer --manifest-path "$repo/Cargo.toml"
  OVERSEER_BIN="$target/debug/overseer"
fi
export OVERSEER_BIN
cd "$sdk"
exec "$venv/bin/python" -m pytest -p no:cacheprovider -q "$@" tests
