#!/usr/bin/env bash
# Set up, then run the test suite. Extra arguments go to pytest (e.g. -m "not slow", -k model).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh requirements-test.txt
exec .venv/bin/python -m pytest -q "$@"
