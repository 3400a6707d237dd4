#!/usr/bin/env bash
# The paper's MAD grid (configs/mad/paper_baseline.toml) for attention and Parallax on one GPU:
# 66 settings x lr {5e-3, 1e-3, 5e-4} x weight decay {0, 0.1} x 2 mixers = 792 runs, 60 epochs each.
# Resumable: each call starts new runs for DEADLINE seconds (largest first) and stops all work at
# LIMIT seconds; every finished run is appended to runs.jsonl and runs already there are skipped.
# Each run saves its training state every CHECKPOINT_SECONDS (default 60; 0: off) to partial/ in the
# grid's folder, and the next call continues the runs cut short from there (first), with the result an
# uninterrupted run would give, so a run longer than LIMIT still finishes over several calls.
# The grid lives in GRID (runs.jsonl committed between calls; the partial states carried, never
# committed: .gitignore); with $OUT set (a folder that outlives the call) the call works on a copy of
# runs.jsonl and the partial states under $OUT/<GRID's folder name>, which comes back even when the
# call is cut short; there the states go back as tar files partial_<i>.tar of at most 15 MiB
# (python -m eval.mad.bundle: an output folder returns few files of bounded size). Copy that folder
# over GRID, its partial_*.tar replacing GRID's (and GRID's partial/ removed), commit runs.jsonl, and
# carry GRID's partial_*.tar into the next call, which unpacks them. TASKS narrows the grid (e.g. TASKS=ICR,FCR,NCR), SWEEP=baseline to MAD's six
# baseline settings (a subset of the full sweep's runs, which later calls complete), SETTINGS to the
# settings whose label contains one of its comma-separated fragments (e.g. SETTINGS=seq_len=512; a whole
# label such as "ICR(vocab_size=16,seq_len=128)" is one fragment).
# COMPILE=1 compiles each run's blocks (--compile; the runs count in the same grid).
# MPS=1 starts NVIDIA's multi-process service first, so that the workers' small kernels run side by side
# instead of time-sliced; if it does not start, or a CUDA call under it fails, the grid runs without it.
#   bash eval/mad/gpu_baseline.sh [WORKERS] [DEADLINE_SECONDS] [LIMIT_SECONDS]
# Another grid: CONFIG (a configs/mad/ file), MIXERS (comma list; unset: attention,parallax; empty: the
# config's [grid] mixers) and GRID, e.g. the family grid (it shares paper_baseline's settings: a copy of
# that grid's runs.jsonl in GRID counts):
#   CONFIG=configs/mad/family.toml MIXERS= GRID=docs/mad/family_grid bash eval/mad/gpu_baseline.sh 8
# On the H200 box (no network) the carried wheels in .whl/ (and .whl_mad/ for numpy; .whl_fla/, with
# .whl_tilelang/ and .whl_z3/ where present, for the fla mixers) are installed first.
set -uo pipefail
cd "$(dirname "$0")/../.."
grid=${GRID:-docs/mad/paper_grid}
config=${CONFIG:-configs/mad/paper_baseline.toml}
mixers=${MIXERS-attention,parallax}
workers=${1:-8}
deadline=${2:-240}
limit=${3:-540}
tasks=${TASKS:-all}
sweep=${SWEEP:-}
settings=${SETTINGS:-}
checkpoint=${CHECKPOINT_SECONDS:-60}
compile=
[ "${COMPILE:-0}" = 1 ] && compile=1
out=$grid
if [ -n "${OUT:-}" ]; then
  out=$OUT/$(basename "$grid")
  mkdir -p "$out"
  [ -f "$grid/runs.jsonl" ] && cp "$grid/runs.jsonl" "$out/"
  [ -d "$grid/partial" ] && cp -r "$grid/partial" "$out/"
  cp "$grid"/partial_*.tar "$out/" 2>/dev/null
fi
mkdir -p "$out"
if ! python3 -c "import torchtitan" 2>/dev/null; then
  python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl
  export PYTHONPATH=/tmp/site:${PYTHONPATH:-}
fi
python3 -c "import numpy" 2>/dev/null || python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl_mad/numpy*.whl
if [ -d .whl_fla ] && ! python3 -c "import fla.layers" 2>/dev/null; then
  python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site \
    $(ls .whl_tilelang/*.whl .whl_z3/*.whl 2>/dev/null) .whl_fla/*.whl
fi
export PYTHONPATH=/tmp/site:${PYTHONPATH:-}
nvidia-smi --query-gpu=name,memory.used --format=csv,noheader
if [ "${MPS:-0}" = 1 ]; then
  export CUDA_MPS_PIPE_DIRECTORY=/tmp/mps_pipe CUDA_MPS_LOG_DIRECTORY=/tmp/mps_log
  mkdir -p "$CUDA_MPS_PIPE_DIRECTORY" "$CUDA_MPS_LOG_DIRECTORY"
  if nvidia-cuda-mps-control -d && timeout 60 python3 -c "import torch; torch.ones(1, device='cuda').sum().item()"; then
    echo "MPS: on"
    trap 'echo quit | nvidia-cuda-mps-control' EXIT
  else
    echo quit | nvidia-cuda-mps-control 2>/dev/null
    unset CUDA_MPS_PIPE_DIRECTORY CUDA_MPS_LOG_DIRECTORY
    echo "MPS: did not start; running without it"
  fi
fi
# the grid and report options; how the runs execute (--compile, --checkpoint-seconds) goes to the run
# call only, as --report-only refuses them
args=(--config "$config" ${mixers:+--mixers "$mixers"} ${sweep:+--sweep "$sweep"} ${settings:+--settings "$settings"}
      --tasks "$tasks" --out "$out"
      --title "MAD, paper protocol ($config), ${mixers:-every mixer of the config}, one H200"
      --note "Command: CONFIG=$config MIXERS=$mixers bash eval/mad/gpu_baseline.sh $workers $deadline $limit (TASKS=$tasks SWEEP=$sweep SETTINGS=$settings), repeated; each call skips finished runs.")
python3 -m eval.mad.bundle unpack "$out"
timeout "$limit" python3 -m eval.mad "${args[@]}" ${compile:+--compile} --checkpoint-seconds "$checkpoint" \
  --workers "$workers" --deadline "$deadline" 2>&1 | tee -a "$out/log.txt"
# $OUT comes back as a few files of at most 16 MiB each: the partial states go as tars of <= 15 MiB
[ -n "${OUT:-}" ] && python3 -m eval.mad.bundle pack "$out"
python3 -m eval.mad "${args[@]}" --report-only | tail -3
