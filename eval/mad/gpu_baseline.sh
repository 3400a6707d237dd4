#!/usr/bin/env bash
# The six MAD baseline settings, attention and Parallax (Triton), Muon + WSD, lr {5e-3, 1e-3, 5e-4},
# every (setting, mixer, lr) run as its own process on one H200 (36 concurrent runs); each run is
# shortened (schedule included) to about RUN_SECONDS of training if the epochs would not fit.
#   bash eval/mad/gpu_baseline.sh [EPOCHS] [RUN_SECONDS]     (writes under ${OUT:-outputs}/mad_baseline_gpu)
# On the H200 box (no network) the carried wheels in .whl/ (and .whl_mad/ for numpy) are installed first.
set -uo pipefail
cd "$(dirname "$0")/../.."
out=${OUT:-outputs}/mad_baseline_gpu
epochs=${1:-20}
deadline=${2:-240}
mkdir -p "$out"
if ! python3 -c "import torchtitan" 2>/dev/null; then
  python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl
  export PYTHONPATH=/tmp/site:${PYTHONPATH:-}
fi
python3 -c "import numpy" 2>/dev/null || python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl_mad/numpy*.whl
export PYTHONPATH=/tmp/site:${PYTHONPATH:-}
nvidia-smi --query-gpu=name,memory.used --format=csv,noheader
python3 -m eval.mad --config configs/mad/paper_baseline.toml --sweep baseline --tasks all \
  --mixers attention,parallax --epochs "$epochs" --workers 36 --deadline 30 --max-run-seconds "$deadline" \
  --out "$out" --title "MAD baseline settings on one H200 ($epochs epochs)" 2>&1 | tee "$out/log.txt"
