"""Training throughput of the paper configs, and the 1-GPU vs N-GPU scaling check.

Throughput: tokens/s per GPU, MFU and peak memory per variant, measured in one invocation, with
ratios against the first variant::

    python scripts/bench_train.py transformer parallax parallax_dagger --ngpu 1 --steps 30
    python scripts/bench_train.py transformer parallax --ngpu 8 --steps 300     # the 8-GPU run
    python scripts/bench_train.py parallax --name-prefix reference_ \\
        --extra "--parallax.attn_backend reference --compile.no-enable"
    python scripts/bench_train.py titan_qwen3 transformer --recipe adamw_wsd   # TorchTitan's own trainer first

Scaling (``--scaling N``): the first variant (a) on 1 GPU with local batch B and gradient
accumulation N (global batch B x N) and (b) on N GPUs with local batch B, both with
``training.data_order = "global"`` from one seed checkpoint, so the two runs take the same steps::

    python scripts/bench_train.py parallax --scaling 2 --steps 30

Resume (``--resume K``): the first variant on one GPU straight for ``--steps`` steps, and the same
run stopped at step K (``reliability.stop_at_step``, which saves a full checkpoint) and rerun with
the same command, which resumes from it; the losses of the two step by step (``resume.md``)::

    python scripts/bench_train.py parallax --resume 8 --steps 16

Every run is ``torchrun train.py`` on ``configs/paper/<flavor>/<variant>_<recipe>.toml`` (or one
``--config`` for every variant, with the variant and flavor set on the command line) on the
embedded corpus; with the paper configs it needs the Qwen3 tokenizer in assets/ (no network) and
uses the config's compile and FSDP2. Throughput and MFU are means over the logged steps after the
first half. Results go to OUT (``--out``, else $OUT, else outputs/bench_train):
``<run>/metrics.jsonl``, ``<run>.log``, ``summary.md``/``summary.json``, and with ``--scaling``
``scaling.md``/``scaling.json`` (``--resume``: ``resume.md``/``resume.json``).
"""

from __future__ import annotations

import argparse
import os
import shlex
import shutil
import signal
import subprocess
import sys

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)

from scripts.summarize_runs import markdown, summarize, write_report, write_summary  # noqa: E402

EFFICIENCY_GOAL = 0.90
TIMEOUT_EXIT = 124  # the exit status `timeout` reports


def _glue_extra(argv: list[str]) -> list[str]:
    """``--extra VALUE`` as ``--extra=VALUE``: argparse takes a VALUE like "--compile.no-enable" for an option."""
    glued, i = [], 0
    while i < len(argv):
        if argv[i] == "--extra" and i + 1 < len(argv):
            glued.append(f"--extra={argv[i + 1]}")
            i += 2
        else:
            glued.append(argv[i])
            i += 1
    return glued


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """The command line (see the module docstring)."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("variants", nargs="+", help="model names, e.g. transformer parallax parallax_dagger")
    parser.add_argument("--ngpu", type=int, default=1, help="GPUs per run (throughput mode)")
    parser.add_argument("--steps", type=int, default=30, help="training steps per run")
    parser.add_argument("--recipe", default="muon_wsd", help="config suffix: <variant>_<recipe>.toml")
    parser.add_argument("--flavor", default="0.6B", help="model size: configs/paper/<flavor>/")
    parser.add_argument("--local-batch", type=int, default=4, help="training.local_batch_size")
    parser.add_argument("--extra", default="", help="more train.py arguments, one string, applied last")
    parser.add_argument("--name-prefix", default="", help="prefix of the run names")
    parser.add_argument("--run-timeout", type=int, default=420, help="seconds before a run is stopped")
    parser.add_argument("--out", default=os.environ.get("OUT", os.path.join(REPO, "outputs", "bench_train")),
                        help="output folder (default: $OUT, else outputs/bench_train in the repository)")
    parser.add_argument("--config", help="one config file for every variant instead of the paper configs; "
                        "the variant and --flavor are passed as --model.name and --model.flavor")
    parser.add_argument("--scaling", type=int, default=0, metavar="N",
                        help="scaling check of the first variant: 1 GPU with gradient accumulation N vs N GPUs")
    parser.add_argument("--resume", type=int, default=0, metavar="K",
                        help="resume check of the first variant: straight vs stopped at step K and rerun")
    args = parser.parse_args(_glue_extra(sys.argv[1:] if argv is None else argv))
    args.out = os.path.abspath(args.out)
    args.config = args.config and os.path.abspath(args.config)
    if args.scaling:
        if args.scaling < 2:
            parser.error(f"--scaling {args.scaling}: expected a number of GPUs >= 2")
        if len(args.variants) > 1 or args.ngpu != 1:
            parser.error("--scaling measures one variant on 1 and N GPUs; give one variant and no --ngpu")
    if args.resume and not (0 < args.resume < args.steps and len(args.variants) == 1 and not args.scaling):
        parser.error(f"--resume {args.resume}: expected one variant, no --scaling and 0 < K < --steps ({args.steps})")
    return args


# TorchTitan's own trainer and Qwen3 on the Transformer's config (scripts/titan_reference.py)
REFERENCE = "titan_qwen3"


def config_args(args: argparse.Namespace, variant: str) -> list[str]:
    """The config file of ``variant`` (and with ``--config``, the model overrides)."""
    if args.config:
        return ["--job.config_file", args.config, "--model.name", variant, "--model.flavor", args.flavor]
    config = "transformer" if variant == REFERENCE else variant
    return ["--job.config_file", os.path.join("configs", "paper", args.flavor, f"{config}_{args.recipe}.toml")]


def train_command(args: argparse.Namespace, variant: str, name: str, nproc: int, *overrides: str) -> list[str]:
    """``torchrun train.py`` (or the TorchTitan reference) for one benchmark run; ``overrides``
    come before ``--extra``."""
    entry = os.path.join("scripts", "titan_reference.py") if variant == REFERENCE else "train.py"
    return [
        sys.executable, "-m", "torch.distributed.run", f"--nproc_per_node={nproc}", "--local-ranks-filter=0",
        entry, *config_args(args, variant),
        "--training.dataset", "default_corpus", "--training.steps", str(args.steps),
        "--training.global_batch_size", "-1", "--training.local_batch_size", str(args.local_batch),
        "--checkpoint.no-enable", "--metrics.log_freq", "5", "--metrics.no-progress-bar",
        "--job.dump_folder", os.path.join(args.out, name), *overrides, *shlex.split(args.extra),
    ]


def _stop_group(proc: subprocess.Popen) -> None:
    """SIGTERM to ``proc``'s process group, SIGKILL 60 s later if it is still there."""
    os.killpg(proc.pid, signal.SIGTERM)
    try:
        proc.wait(timeout=60)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


def _raise_on_sigterm(signum, frame):
    raise SystemExit(128 + signum)


def run_logged(cmd: list[str], log_path: str, timeout: int, env: dict | None = None) -> int:
    """Run ``cmd`` from the repository root with its output in ``log_path``; its exit status.

    After ``timeout`` seconds the run's process group gets SIGTERM (SIGKILL 60 s later) and the
    status is 124, as with ``timeout``. The run has its own session (so the whole torchrun tree can
    be stopped); when this process is itself stopped (SIGTERM, e.g. an outer ``timeout``, or
    Ctrl-C) the run's group is stopped too instead of being left training on the GPU.
    """
    previous = signal.signal(signal.SIGTERM, _raise_on_sigterm)
    with open(log_path, "w") as log:
        proc = subprocess.Popen(cmd, cwd=REPO, stdout=log, stderr=subprocess.STDOUT, env=env,
                                start_new_session=True)
        try:
            return proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            return TIMEOUT_EXIT
        finally:  # past the timeout, or this process stopped: the run must not outlive it
            if proc.poll() is None:
                _stop_group(proc)
            signal.signal(signal.SIGTERM, previous)


def bench_run(args: argparse.Namespace, variant: str, name: str, nproc: int, *overrides: str,
              env: dict | None = None, fresh: bool = True) -> str | None:
    """One run into ``OUT/name`` (emptied first unless not ``fresh``: a rerun that resumes); its
    folder, or None when it logged no step."""
    folder = os.path.join(args.out, name)
    if fresh:
        shutil.rmtree(folder, ignore_errors=True)
    log_path = folder + (".log" if fresh else ".rerun.log")
    status = run_logged(train_command(args, variant, name, nproc, *overrides), log_path, args.run_timeout, env)
    with open(log_path) as f:
        steps = sum("step:" in line for line in f)
    print(f"{name}: exit {status}, {steps} logged steps", flush=True)
    return folder if os.path.isfile(os.path.join(folder, "metrics.jsonl")) else None


def throughput(args: argparse.Namespace) -> int:
    """Run every variant on ``--ngpu`` GPUs and write OUT/summary.{md,json}; exit status."""
    folders = [bench_run(args, v, args.name_prefix + v, args.ngpu) for v in args.variants]
    rows = [summarize(f, args.steps // 2) for f in folders if f]
    if rows:
        print(write_summary(rows, rows[0]["run"], os.path.join(args.out, "summary")))
    return 0 if all(folders) else 1


def one_gpu_env() -> dict:
    """The environment with only the first visible GPU left visible."""
    first = os.environ.get("CUDA_VISIBLE_DEVICES", "0").split(",")[0]
    return {**os.environ, "CUDA_VISIBLE_DEVICES": first}


def scaling(args: argparse.Namespace) -> int:
    """``--scaling N``: seed checkpoint, then the 1-GPU (accumulation N) and N-GPU runs of one global
    batch, and a 1-GPU run without accumulation (the same work per GPU as each of the N); exit status."""
    n, variant = args.scaling, args.variants[0]
    base = args.name_prefix + variant
    bench_run(args, variant, f"{base}_seed", 1, "--checkpoint.enable", "--checkpoint.create_seed_checkpoint",
              "--checkpoint.last_save_model_only", env=one_gpu_env())
    seed_step0 = os.path.join(args.out, f"{base}_seed", "checkpoint", "step-0")
    if not os.path.isdir(seed_step0):
        print(f"no seed checkpoint at {seed_step0}; see {os.path.join(args.out, base)}_seed.log")
        return 1
    def same(global_batch):
        return ("--training.data_order", "global", "--training.global_batch_size", str(global_batch),
                "--metrics.log_freq", "1", "--checkpoint.enable", "--checkpoint.load_only",
                "--checkpoint.initial_load_path", seed_step0)

    single = bench_run(args, variant, f"{base}_1gpu_accum{n}", 1, *same(args.local_batch * n), env=one_gpu_env())
    multi = bench_run(args, variant, f"{base}_{n}gpu", n, *same(args.local_batch * n))
    plain = bench_run(args, variant, f"{base}_1gpu", 1, *same(args.local_batch), env=one_gpu_env())
    if not (single and multi and plain):
        return 1
    skip = args.steps // 2
    report = scaling_report(summarize(single, skip), summarize(multi, skip), n, summarize(plain, skip))
    print(write_scaling(report, os.path.join(args.out, "scaling")))
    return 0


def scaling_report(single: dict, multi: dict, n: int, plain: dict | None = None) -> dict:
    """Compare the 1-GPU and N-GPU runs (rows of ``summarize``): losses step by step, their largest
    absolute and relative difference, and tokens/s per GPU of N GPUs over 1 GPU: against the 1-GPU
    run of the same global batch (``single``, accumulation N: one optimizer step per N micro-batches)
    and, given ``plain`` (1 GPU, no accumulation), against the same work per GPU, which isolates the
    cost of communication."""
    steps = sorted(set(single["loss"]) & set(multi["loss"]))
    rows = [{"step": s, "loss_1gpu": single["loss"][s], "loss_ngpu": multi["loss"][s],
             "abs_diff": abs(multi["loss"][s] - single["loss"][s]),
             "rel_diff": abs(multi["loss"][s] - single["loss"][s]) / abs(single["loss"][s])} for s in steps]
    return {
        "gpus": n,
        "runs": [single, multi] + ([plain] if plain else []),
        "losses": rows,
        "max_abs_diff": max(r["abs_diff"] for r in rows),
        "max_rel_diff": max(r["rel_diff"] for r in rows),
        "per_gpu_efficiency": multi["tokens_per_s"] / single["tokens_per_s"],
        "per_gpu_efficiency_same_work": multi["tokens_per_s"] / plain["tokens_per_s"] if plain else None,
        "goal": EFFICIENCY_GOAL,
    }


def scaling_markdown(report: dict) -> str:
    """The scaling report as markdown: efficiency, the throughput table, the loss table."""
    n, (single, multi) = report["gpus"], report["runs"][:2]
    verdict = "meets" if report["per_gpu_efficiency"] >= report["goal"] else "misses"
    same_work = report.get("per_gpu_efficiency_same_work")
    lines = [
        f"# Scaling: {single['run']} (1 GPU, gradient accumulation {n}) vs {multi['run']} ({n} GPUs)", "",
        f"Per-GPU efficiency (tokens/s per GPU, {n} GPUs over 1): **{report['per_gpu_efficiency']:.3f}** "
        f"({verdict} the goal {report['goal']:.2f}).", "",
    ]
    if same_work is not None:
        lines += [f"Against 1 GPU without accumulation (the same work per GPU, one optimizer step per "
                  f"micro-batch): **{same_work:.3f}**.", ""]
    lines += [
        f"Loss difference over {len(report['losses'])} steps: max absolute {report['max_abs_diff']:.3g}, "
        f"max relative {report['max_rel_diff']:.3g}.", "",
        markdown(report["runs"], single["run"]),
        f"| step | loss 1 GPU | loss {n} GPUs | abs diff | rel diff |", "|---|---|---|---|---|",
    ]
    lines += [f"| {r['step']} | {r['loss_1gpu']:.6f} | {r['loss_ngpu']:.6f} | {r['abs_diff']:.3g} | {r['rel_diff']:.3g} |"
              for r in report["losses"]]
    return "\n".join(lines) + "\n"


def write_scaling(report: dict, out: str) -> str:
    """Write ``out``.md and ``out``.json; return the markdown."""
    return write_report(scaling_markdown(report), report, out)


def resume_check(args: argparse.Namespace) -> int:
    """``--resume K``: one straight run, one stopped at step K and rerun (resuming); exit status."""
    variant, k = args.variants[0], args.resume
    base = args.name_prefix + variant
    common = ("--metrics.log_freq", "1", "--checkpoint.enable", "--checkpoint.interval", str(10 * args.steps),
              "--reliability.stop_at_step", str(k))
    straight = bench_run(args, variant, f"{base}_straight", 1, "--metrics.log_freq", "1", env=one_gpu_env())
    stopped = bench_run(args, variant, f"{base}_resumed", 1, *common, env=one_gpu_env())
    resumed = stopped and bench_run(args, variant, f"{base}_resumed", 1, *common, env=one_gpu_env(), fresh=False)
    if not (straight and resumed):
        return 1
    report = resume_report(summarize(straight, 0)["loss"], summarize(resumed, 0)["loss"], k)
    print(write_report(resume_markdown(report), report, os.path.join(args.out, "resume")))
    return 0 if report["steps_compared"] == args.steps - k else 1


def resume_report(straight: dict, resumed: dict, k: int) -> dict:
    """Losses (step -> loss) of the straight and the stopped-at-K-and-resumed run: the steps after K
    side by side, how many are bit-identical, the largest absolute and relative difference."""
    steps = sorted(s for s in set(straight) & set(resumed) if s > k)
    rows = [{"step": s, "straight": straight[s], "resumed": resumed[s], "abs_diff": abs(resumed[s] - straight[s]),
             "rel_diff": abs(resumed[s] - straight[s]) / abs(straight[s])} for s in steps]
    return {"stopped_at": k, "steps_compared": len(rows), "identical": sum(r["abs_diff"] == 0 for r in rows),
            "max_abs_diff": max((r["abs_diff"] for r in rows), default=None),
            "max_rel_diff": max((r["rel_diff"] for r in rows), default=None), "losses": rows}


def resume_markdown(report: dict) -> str:
    """The resume report as markdown: the summary line and the loss table."""
    lines = [f"# Resume: stopped at step {report['stopped_at']} and rerun vs one straight run", "",
             f"{report['steps_compared']} steps after the stop compared: {report['identical']} bit-identical, "
             f"max absolute difference {report['max_abs_diff']:.3g}, max relative {report['max_rel_diff']:.3g}.", "",
             "| step | loss straight | loss resumed | abs diff | rel diff |", "|---|---|---|---|---|"]
    lines += [f"| {r['step']} | {r['straight']:.6f} | {r['resumed']:.6f} | {r['abs_diff']:.3g} | {r['rel_diff']:.3g} |"
              for r in report["losses"]]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    """Run the benchmark the command line asks for; the exit status (1 when a run failed)."""
    args = parse_args(argv)
    os.makedirs(args.out, exist_ok=True)
    if args.resume:
        return resume_check(args)
    return scaling(args) if args.scaling else throughput(args)


if __name__ == "__main__":
    sys.exit(main())
