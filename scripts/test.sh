#!/usr/bin/env bash
# The whole test suite, from a fresh clone: installs what it needs, starts nothing it leaves behind.
# Usage: ./scripts/test.sh [pytest args...]
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  "$PY" -m venv .venv
fi
.venv/bin/python -m pip install -q --upgrade pip >/dev/null
.venv/bin/python -m pip install -q -e '.[dev]'
# promtool and prometheus (Debian's package) for the golden-metrics, alert-rule and end-to-end tests.
if ! command -v promtool >/dev/null 2>&1 || ! command -v prometheus >/dev/null 2>&1; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    echo "installing Debian's prometheus package (promtool + prometheus)..." >&2
    apt-get update -qq >/dev/null
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends prometheus >/dev/null
  else
    echo "warning: promtool/prometheus not found and cannot apt-get install; those tests will fail" >&2
  fi
fi
exec .venv/bin/python -m pytest "$@"
