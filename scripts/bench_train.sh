#!/usr/bin/env bash
# Training throughput of the 0.6B paper configs: tokens/s per GPU, MFU and peak memory per variant,
# measured in one invocation, with ratios against the first variant. Runs on the embedded corpus
# with the Qwen3 tokenizer (no network needed); every run uses its config's compile and FSDP2.
#
#   NGPU=1 STEPS=30 bash scripts/bench_train.sh transformer parallax parallax_dagger
#   NGPU=8 STEPS=300 bash scripts/bench_train.sh transformer parallax     # the 8-GPU run
#   EXTRA="--parallax.attn_backend reference --compile.no-enable" bash scripts/bench_train.sh parallax
#
# Results go to ${OUT:-outputs/bench_train}/{<variant>/metrics.jsonl,<variant>.log,summary.md,summary.json}.
set -uo pipefail
cd "$(dirname "$0")/.."
out=${OUT:-outputs/bench_train}
ngpu=${NGPU:-1}
steps=${STEPS:-30}
recipe=${RECIPE:-muon_wsd}
flavor=${FLAVOR:-0.6B}
mkdir -p "$out"
runs=()
for variant in "$@"; do
  name=${NAME_PREFIX:-}$variant
  # shellcheck disable=SC2086  # EXTRA holds several arguments
  timeout "${RUN_TIMEOUT:-420}" torchrun --nproc_per_node="$ngpu" --local-ranks-filter=0 train.py \
    --job.config_file "configs/paper/$flavor/${variant}_${recipe}.toml" \
    --training.dataset default_corpus --training.steps "$steps" --training.global_batch_size -1 \
    --training.local_batch_size "${LOCAL_BATCH:-4}" --checkpoint.no-enable --metrics.log_freq 5 \
    --metrics.no-progress-bar --job.dump_folder "$out/$name" ${EXTRA:-} > "$out/$name.log" 2>&1
  echo "$name: exit $?, $(grep -c 'step:' "$out/$name.log") logged steps"
  runs+=("$out/$name")
done
python3 scripts/summarize_runs.py "${runs[@]}" --baseline "$(basename "${runs[0]}")" --skip $((steps / 2)) \
  --out "$out/summary"
