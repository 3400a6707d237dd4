#!/usr/bin/env bash
# The GPU checks CI cannot run, in one command on an H200 machine without network access: each named
# check runs on its own GPU when the machine has two (checks that need both GPUs run last, alone),
# every check under the time left, and everything lands in one tarball under $OUT/h200_checks (default: outputs/h200_checks).
#
#   bash scripts/h200_checks.sh [BUDGET_SECONDS] CHECK...
#
# Every benchmark runs as `python3 -m scripts.bench.<name>` from the repository root. CHECK is one of
#   gpu-tests     pytest -m gpu over tests/: every GPU test (those needing fla or two GPUs skip without them)
#   kernel-tests  pytest -m gpu on the attention, decode and projection kernels (and the trainer's flag copy), the
#                 kernels' hostile inputs (grids, devices, 64-bit offsets) and the HF modeling's fused path
#   fla-tests     pytest -m gpu on the fla mixers (needs the .whl_fla wheels installed)
#   fla-match     the fla GPU tests not yet seen passing, one process each, under a hard limit (FLA_TIMEOUT, 150 s)
#   fla-fsdp      the fla mixer's 1- vs 2-rank FSDP2 test (needs 2 GPUs and minutes: three train.py runs compile fla)
#   attention     scripts.bench.attention --no-competitors (our kernels vs cuDNN / flash)
#   attention-sweep  the same, autotuning over the wider sweep lists (incl. the ROWS column-pass candidates
#                 and the TMA configs)
#   attention-hopper  scripts.bench.attention_hopper: the Hopper kernels under each launch config candidate
#                 beside the Triton ones (the backward's passes, then the forward)
#   attention-row  scripts.bench.attention_hopper --row: the row pass's statistics in registers or in shared
#                 memory, timed interleaved at three shapes (D=128), with whether their gradients' bits agree
#   attention-loops  scripts.bench.attention_loops: the kernels per shipped config with warp-specialized,
#                 per-loop-pipelined or TMA tile loads beside the shipped ones
#   family-tests  pytest -m gpu on the Parallax family's kernels and mixers, the orthogonalisers and the
#                 fused projection (-rA: every test's outcome in the log)
#   competitors   scripts.bench.attention on B4 L4096 D128 with parallax-kernel and fla (slow autotune)
#   decode        scripts.bench.decode --check (KV-cache decode vs cuDNN, and the published kernels if installed)
#   projection    scripts.bench.projection (the fused norm + RoPE kernels per launch config vs a copy and Inductor)
#   probe-cost    scripts.bench.probe_cost (0.6B Parallax and Parallax-dagger: the probe's cost outside the kernel)
#   throughput    scripts.bench.train transformer parallax parallax_dagger (0.6B, Muon + WSD, 30 steps; ROUNDS=R
#                 runs the variants R times in turn, default 1)
#   throughput-adamw  the same with the AdamW + WSD configs (the optimizer of TorchTitan's MFU reference)
#   throughput-float8  transformer and parallax with float8 linears (torchao, tensorwise; the LM head kept bf16)
#   power         transformer and parallax, AdamW + WSD, with their SM clocks and power (gpu_telemetry), then
#                 under each step probe: a GPU sleep before each forward, a host delay per attention call,
#                 step 15 profiled with GPU activity only (trace summaries kept, traces dropped)
#   guard-ab      transformer, AdamW + WSD, with and without the non-finite guard (its host sync per step)
#   reference     TorchTitan's own trainer and Qwen3 (scripts.bench.titan_reference) beside our transformer,
#                 AdamW + WSD: TorchTitan's MFU and ours in one invocation
#   mixer-gdn / mixer-kda  scripts.bench.train on that fla mixer, MIXER_STEPS steps (default 300; needs fla,
#                 and tilelang for GDN on this box; KDA's first step autotunes for minutes)
#   optimizers    scripts.bench.optimizers
#   muon-profile  scripts.bench.optimizers on Muon (Polar Express) alone, one step profiled (trace summary)
#   gram          pytest -m gpu on the symmetric-product kernel (kernels.gram) and Polar Express with it,
#                 then scripts.bench.gram (the kernel vs torch's bmm / baddbmm per 0.6B Muon bucket)
#   resume        scripts.bench.train parallax --resume 8 --steps 16 (one GPU: a run stopped at step 8
#                 and rerun against a straight one, losses step by step)
#   scaling       scripts.bench.train parallax --scaling 2 (needs 2 GPUs; runs after the others)
#   scaling-noreshard  the same with FSDP keeping the gathered parameters from forward to backward
#                 (parallelism.fsdp_reshard_after_forward = "never": one all-gather per step, not two)
#   profile-transformer  one GPU, 0.6B Transformer, step 20 profiled, scripts.bench.trace_summary of it
#   profile-parallax  the same for the 0.6B Parallax
#   profile-2gpu  two GPUs (FSDP2), 0.6B Parallax, step 20 profiled, summaries of both ranks (runs last)
#
# Beforehand, on a machine with network access: `bash scripts/gpu_wheels.sh` (TorchTitan's wheels in
# .whl/); copy .whl and assets (and .whl_fla / .whl_bench for the fla and competitor checks) to the
# GPU machine and install them first:
#   python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site
set -uo pipefail
cd "$(dirname "$0")/.."
budget=${1:?usage: h200_checks.sh BUDGET_SECONDS CHECK...}
rounds=${ROUNDS:-1}
case $rounds in ''|*[!0-9]*|0) echo "ROUNDS=$rounds: expected a number of rounds >= 1" >&2; exit 2 ;; esac
shift
out=${OUT:-outputs}/h200_checks
work=$(mktemp -d)
end=$(( $(date +%s) + budget ))
left() { echo $(( end - $(date +%s) )); }

profile() {  # variant ngpu seconds: profile step 20, keep the trace summaries, drop the traces
  local dir="$work/profile_$1_$2gpu" rank
  python3 -m scripts.bench.train "$1" --ngpu "$2" --steps 22 --run-timeout "$3" --out "$dir" \
    --extra "--profiling.enable_profiling --profiling.profile_freq 20 --profiling.save_traces_folder traces"
  for rank in $(seq 0 $(( $2 - 1 ))); do
    python3 -m scripts.bench.trace_summary "$dir/$1/traces/iteration_20/rank${rank}_trace.json" \
      --out "$dir/summary_rank$rank"
  done
  rm -rf "$dir/$1/traces"
}

power() {  # seconds: AdamW Transformer and Parallax with their clocks and power, then under each step probe
  local b="python3 -m scripts.bench.train --recipe adamw_wsd --steps 20 --run-timeout $(( $1 / 7 ))" v
  $b transformer parallax --out "$work/power/plain"
  $b parallax transformer --probe "--gpu-sleep-ms 20" --out "$work/power/gpu_sleep"
  $b parallax --probe "--host-delay-us 150" --out "$work/power/host_delay"
  $b transformer parallax --probe "--cuda-profile-step 15" --out "$work/power/gpu_profile"
  for v in transformer parallax; do
    python3 -m scripts.bench.trace_summary "$work/power/gpu_profile/$v/gpu_profile/rank0_step15.json" \
      --out "$work/power/gpu_profile_$v"
    rm -rf "$work/power/gpu_profile/$v/gpu_profile"
  done
}

run_check() {  # name: runs one check with the time left, logs to $work/<name>.log
  local name=$1 t
  t=$(( $(left) - 10 ))
  case $name in
    gpu-tests) timeout -s INT "$t" python3 -m pytest -m gpu -q -rfEs --tb=short -p no:cacheprovider tests ;;
    kernel-tests) timeout "$t" python3 -m pytest -m gpu -q -p no:cacheprovider tests/test_parallax_fused.py tests/test_nonfinite.py \
                    tests/test_parallax_hopper.py tests/test_parallax_decode.py tests/test_projection_kernel.py \
                    tests/test_kernels_hostile.py tests/test_hf_modeling.py ;;
    fla-tests) timeout "$t" python3 -m pytest -m gpu -v -p no:cacheprovider --timeout 90 tests/test_mixers_fla.py ;;
    attention) timeout "$t" python3 -m scripts.bench.attention --no-competitors --out "$work/attention_train" ;;
    projection) timeout "$t" python3 -m scripts.bench.projection --out "$work/projection" ;;
    probe-cost) timeout "$t" python3 -m scripts.bench.probe_cost --out "$work/probe_cost" \
                  && timeout "$t" python3 -m scripts.bench.probe_cost --variant parallax_dagger --out "$work/probe_cost_dagger" ;;
    attention-hopper) timeout "$t" python3 -m scripts.bench.attention_hopper --out "$work/attention_hopper" \
                        && timeout "$t" python3 -m scripts.bench.attention_hopper --forward \
                             --out "$work/attention_hopper_forward_sweep" ;;
    attention-row) timeout "$t" python3 -m scripts.bench.attention_hopper --row --out "$work/attention_hopper_row" ;;
    attention-sweep) timeout "$t" python3 -m scripts.bench.attention --sweep --no-competitors \
                       --out "$work/attention_sweep" ;;
    attention-loops) timeout "$t" python3 -m scripts.bench.attention_loops --out "$work/attention_loops" ;;
    family-tests) timeout -s INT "$t" python3 -m pytest -m gpu -q -rA --tb=short -p no:cacheprovider \
                    tests/test_family_fused.py tests/test_mixers_family.py tests/test_mad_family.py \
                    tests/test_optimizers_ortho.py tests/test_model_fused_projection.py ;;
    competitors) timeout "$t" python3 -m scripts.bench.attention --shapes 0 --out "$work/attention_competitors" \
                   --methods softmax_cudnn,parallax_ours,parallax_kernel_0.1.1,fla_0.6.0 ;;
    decode) timeout "$t" python3 -m scripts.bench.decode --check --out "$work/decode/attention_decode" ;;
    throughput) python3 -m scripts.bench.train transformer parallax parallax_dagger --steps 30 --rounds "$rounds" \
                  --run-timeout $(( t / (3 * rounds) )) --out "$work/throughput" ;;
    throughput-adamw) python3 -m scripts.bench.train transformer parallax --steps 30 --recipe adamw_wsd \
                        --rounds "$rounds" --run-timeout $(( t / (3 * rounds) )) --out "$work/throughput_adamw" ;;
    throughput-float8) python3 -m scripts.bench.train transformer parallax --steps 30 --name-prefix float8_ \
                         --extra "--model.converters quantize.linear.float8 --quantize.linear.float8.filter_fqns output" \
                         --run-timeout $(( t / 3 )) --out "$work/throughput_float8" ;;
    guard-ab) for guard in skip off; do
                python3 -m scripts.bench.train transformer --steps 30 --recipe adamw_wsd --name-prefix "guard_${guard}_" \
                  --extra "--reliability.nonfinite $guard" --run-timeout $(( t / 2 - 5 )) --out "$work/guard_$guard"
              done ;;
    reference) python3 -m scripts.bench.train titan_qwen3 transformer --steps 30 --recipe adamw_wsd \
                 --run-timeout $(( t / 2 - 5 )) --out "$work/reference" ;;
    mixer-gdn|mixer-kda) mixer=${name#mixer-}; [ "$mixer" = gdn ] && mixer=gated_deltanet
              python3 -m scripts.bench.train "$mixer" --steps "${MIXER_STEPS:-300}" --run-timeout "$t" \
                --out "$work/$name" ;;
    fla-match) for id in "block_backward_gives_finite_gradients_to_every_parameter[kda]" \
                 "block_backward_gives_finite_gradients_to_every_parameter[mamba2]" \
                 "block_backward_gives_finite_gradients_to_every_parameter[mesa_net]" \
                 "block_causal_isolates_documents[kda]" "block_causal_isolates_documents[mesa_net]"; do
                 # a hard limit per process (pytest-timeout could not stop fla's compiles), within the budget
                 limit=$(( $(left) - 10 )); [ "$limit" -gt "${FLA_TIMEOUT:-150}" ] && limit=${FLA_TIMEOUT:-150}
                 [ "$limit" -lt 30 ] && { echo "$id: not run, $(left) s left"; continue; }
                 timeout "$limit" python3 -m pytest -m gpu -q --tb=short -p no:cacheprovider \
                   "tests/test_mixers_fla.py::test_gpu_$id"; echo "$id: exit $?"
               done ;;
    fla-fsdp) timeout "$t" python3 -m pytest -m gpu -q --tb=short -p no:cacheprovider tests/test_mixers_fla.py \
                -k two_rank_fsdp ;;
    optimizers) timeout "$t" python3 -m scripts.bench.optimizers --out "$work/optimizers" ;;
    muon-profile) timeout "$t" python3 -m scripts.bench.optimizers --only adamw,muon_polar_express --no-fwd-bwd \
                    --profile "$work/muon_profile" --out "$work/muon_profile/optimizers" ;;
    gram) timeout -s INT $(( t / 2 )) python3 -m pytest -m gpu -q -rA --tb=short -p no:cacheprovider \
            tests/test_gram_kernel.py; tests=$?
          bench_t=$(( $(left) - 10 )); [ "$bench_t" -lt 1 ] && bench_t=1  # timeout 0 would mean no limit
          timeout "$bench_t" python3 -m scripts.bench.gram --out "$work/gram"; bench=$?
          [ "$tests" -eq 0 ] && [ "$bench" -eq 0 ] ;;  # the check's exit status: both passed
    resume) python3 -m scripts.bench.train parallax --resume 8 --steps 16 --run-timeout $(( t / 3 - 5 )) \
              --out "$work/resume" ;;
    scaling) python3 -m scripts.bench.train parallax --scaling 2 --steps 24 --run-timeout $(( t / 3 )) \
               --out "$work/scaling" ;;
    scaling-noreshard) python3 -m scripts.bench.train parallax --scaling 2 --steps 24 --run-timeout $(( t / 3 )) \
                         --multi-gpu-extra "--parallelism.fsdp_reshard_after_forward never" \
                         --out "$work/scaling_noreshard" ;;
    profile-transformer) profile transformer 1 "$t" ;;
    profile-parallax) profile parallax 1 "$t" ;;
    power) power "$t" ;;
    profile-2gpu) profile parallax 2 "$t" ;;
  esac > "$work/$name.log" 2>&1
  echo "$name: exit $?, $(( budget - $(left) )) s into the call" | tee -a "$work/status.txt"
  pack
}

pack() {  # the tarball of everything so far, replaced atomically: a call killed later still returns it
  mkdir -p "$out"
  flock "$work/.pack" tar czf "$out/.h200_checks.tgz.part" --exclude="*.distcp" --exclude=checkpoint \
    --exclude=.pack -C "$work" . && mv -f "$out/.h200_checks.tgz.part" "$out/h200_checks.tgz"
}

known=" gpu-tests kernel-tests projection probe-cost fla-tests fla-match fla-fsdp attention attention-hopper attention-row attention-sweep attention-loops family-tests competitors decode throughput throughput-adamw throughput-float8 power guard-ab reference mixer-gdn mixer-kda optimizers muon-profile gram resume scaling scaling-noreshard profile-transformer profile-parallax profile-2gpu "
for check in "$@"; do
  [[ $known == *" $check "* ]] || { echo "h200_checks.sh: unknown check '$check'; expected one of:$known"; exit 2; }
done
ngpu=${NGPU:-$(python3 -c "import torch; print(torch.cuda.device_count())")}
{ nvidia-smi --query-gpu=name,memory.used --format=csv,noheader; nvidia-smi topo -m; } > "$work/gpus.txt" 2>&1
single=() both=()
for check in "$@"; do
  case $check in scaling|scaling-noreshard|profile-2gpu|fla-fsdp) both+=("$check") ;; *) single+=("$check") ;; esac
done
# two lanes (one per GPU) take the single-GPU checks in turn
for lane in 0 1; do
  [ "$lane" -ge "$ngpu" ] && break
  (
    export CUDA_VISIBLE_DEVICES=$lane
    # torchrun reads PET_MASTER_PORT: two lanes on the default port 29500 collide (EADDRINUSE)
    export PET_MASTER_PORT=$(( 29600 + 10 * lane ))
    for i in "${!single[@]}"; do
      if [ $(( i % (ngpu > 1 ? 2 : 1) )) -eq "$lane" ]; then run_check "${single[$i]}"; fi
    done
  ) &
done
wait
for check in "${both[@]}"; do run_check "$check"; done

pack
cat "$work/status.txt"
for f in "$work"/*/summary_rank*.md "$work"/*/summary.md "$work"/scaling*/scaling.md "$work"/resume/resume.md \
         "$work"/attention_train.md; do
  [ -f "$f" ] && { echo "== $f"; head -30 "$f"; }
done
grep -hE "passed|failed" "$work"/*tests.log 2>/dev/null | tail -4 || true  # no tests in this call: still exit 0
