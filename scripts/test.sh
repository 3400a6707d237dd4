#!/usr/bin/env bash
# Set up, then run the test suite. Extra arguments go to pytest; without any, the tests marked slow
# (multi-process end-to-end runs, several minutes together) are left out: run them with -m slow.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh requirements-test.txt
if [ "$#" -eq 0 ]; then
  set -- -m "not slow"
fi
exec .venv/bin/python -m pytest -q "$@"
