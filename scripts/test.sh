#!/usr/bin/env bash
# Set up, then run the test suite. Extra arguments go to pytest; without any, the tests marked slow
# (multi-process end-to-end runs, several minutes together) are left out: run them with -m slow.
# Two pytest-xdist workers (the 2 cores of CI and the development machines), each test file kept on one
# worker so its module fixtures run once; `-n 0` after them runs in one process.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh requirements-test.txt
if [ "$#" -eq 0 ]; then
  set -- -m "not slow"
fi
exec .venv/bin/python -m pytest -q -n 2 --dist loadfile "$@"
