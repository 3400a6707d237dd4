#!/usr/bin/env bash
# Few-step bf16 runs of the 0.6B paper configs on one GPU (embedded corpus, Qwen3 tokenizer):
# Transformer (SDPA) and Parallax (Triton) compiled, and Parallax with the reference backend
# for the loss comparison. Writes metrics and a summary table under ${OUT:-outputs/gpu_smoke}.
#   bash scripts/gpu_smoke.sh [STEPS]
set -uo pipefail
cd "$(dirname "$0")/.."
out=${OUT:-outputs/gpu_smoke}
steps=${1:-30}
mkdir -p "$out"
run() {  # name config extra-args...
  local name=$1 config=$2; shift 2
  timeout 240 torchrun --nproc_per_node=1 train.py --job.config_file "$config" \
    --training.dataset default_corpus --training.steps "$steps" --training.global_batch_size -1 \
    --training.local_batch_size 4 --checkpoint.no-enable --metrics.log_freq 5 \
    --metrics.no-progress-bar --job.dump_folder "$out/$name" "$@" > "$out/$name.log" 2>&1
  echo "$name exit $? $(grep -c 'step:' "$out/$name.log") logged steps"
}
run transformer configs/paper/0.6B/transformer_muon_wsd.toml
run parallax configs/paper/0.6B/parallax_muon_wsd.toml
run parallax_dagger configs/paper/0.6B/parallax_dagger_muon_wsd.toml
run parallax_reference configs/paper/0.6B/parallax_muon_wsd.toml --parallax.attn_backend reference --compile.no-enable
python3 scripts/summarize_runs.py "$out"/transformer "$out"/parallax "$out"/parallax_dagger \
  "$out"/parallax_reference --baseline transformer --out "$out/smoke"
