#!/usr/bin/env bash
# The main job: set up, then train a small Parallax model on the embedded corpus on the CPU.
# Extra arguments are passed to train.py (e.g. --training.steps 100). The launcher is torchrun with
# a shutdown timeout that covers a checkpoint save (TORCH_ELASTIC_SHUTDOWN_TIMEOUT, 600 s unless
# set) and SIGTERM handled as a stop: the run saves a checkpoint and exits 0 (docs/resume.md).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
exec .venv/bin/python -m parallax_titan.launch --nproc_per_node=1 train.py --job.config_file configs/demo_cpu.toml "$@"
