#!/usr/bin/env bash
# The main job: set up, then train a small Parallax model on the embedded corpus on the CPU.
# Extra arguments are passed to train.py (e.g. --training.steps 50).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
exec .venv/bin/torchrun --nproc_per_node=1 train.py --job.config_file configs/demo_cpu.toml "$@"
