"""Training throughput of the paper configs, the 1-GPU vs N-GPU scaling check and the resume check.

Throughput: tokens/s per GPU, MFU and peak memory per variant, measured in one invocation, with
ratios against the first variant::

    python -m scripts.bench.train transformer parallax parallax_dagger --ngpu 1 --steps 30
    python -m scripts.bench.train transformer parallax --ngpu 8 --steps 300     # the 8-GPU run
    python -m scripts.bench.train parallax --name-prefix reference_ \\
        --extra "--parallax.attn_backend reference --compile.no-enable"
    python -m scripts.bench.train titan_qwen3 transformer --recipe adamw_wsd   # TorchTitan's own trainer first

``--extra`` goes to every run: a ``[parallax]`` kernel switch (``attn_backend``, ``fused_norm_rope``,
``hopper_kernels``) only with variants that read it, as above (the config check refuses it on the
others). ``--multi-gpu-extra`` goes to the runs on more than one GPU only, for settings a one-GPU
run does not read (FSDP's, refused there by the config check).

Scaling (``--scaling N``): the first variant (a) on 1 GPU with local batch B and gradient
accumulation N (global batch B x N) and (b) on N GPUs with local batch B, both with
``training.data_order = "global"`` from one seed checkpoint, so the two runs take the same steps::

    python -m scripts.bench.train parallax --scaling 2 --steps 30
    python -m scripts.bench.train parallax --scaling 2 --steps 24 \\
        --multi-gpu-extra "--parallelism.fsdp_reshard_after_forward never"   # on the N-GPU run

Resume (``--resume K``): the first variant on one GPU straight for ``--steps`` steps, and the same
run stopped at step K (``reliability.stop_at_step``, which saves a full checkpoint) and rerun with
the same command, which resumes from it; the losses of the two step by step (``resume.md``)::

    python -m scripts.bench.train parallax --resume 8 --steps 16

Rounds (``--rounds R``): the variants run R times in turn (A B A B ...; runs ``<variant>_r<k>``), so
that a drift of the machine's clocks over the invocation reaches every variant alike; the summary
adds each variant's ratio to the first within each round, their median and range::

    python -m scripts.bench.train transformer parallax --recipe adamw_wsd --rounds 3

Probes (``--probe``): the runs under ``scripts.bench.step_probe`` (a step profiled with GPU activity
only, a GPU sleep before each forward, a host delay per attention call)::

    python -m scripts.bench.train transformer parallax --recipe adamw_wsd \\
        --probe "--cuda-profile-step 15"     # traces in OUT/<run>/gpu_profile

Run from the repository root. Every run is ``torchrun train.py`` on
``configs/paper/<flavor>/<variant>_<recipe>.toml`` (or one ``--config`` for every variant, with the
variant and flavor set on the command line) on the embedded corpus; with the paper configs it
needs the Qwen3 tokenizer in assets/ (no network) and uses the config's compile and FSDP2.
``titan_qwen3`` is TorchTitan's own trainer and Qwen3 (``torchrun -m scripts.bench.titan_reference``)
on the Transformer's config. Throughput and MFU are means over the logged steps after the first
half. Results go to OUT (``--out``, else $OUT, else outputs/bench_train): ``<run>/metrics.jsonl``,
``<run>.log``, ``<run>.gpu.csv`` (SM clock and power samples, ``gpu_telemetry``; median clock, power and
the power-capped share of each run are columns of the summary), ``summary.md``/``summary.json``, and
with ``--scaling`` ``scaling.md``/``scaling.json`` (``--resume``: ``resume.md``/``resume.json``). The
parts: ``train_launch`` (the torchrun commands), ``train_scaling`` and ``train_resume`` (the two checks).
"""

from __future__ import annotations

import argparse
import os
import shlex
import sys

from parallax_titan.checkpoint_files import check_output_folder
from scripts.bench.gpu_telemetry import summarize_file
from scripts.bench.results import command_line, describe, positive_int, write_results
from scripts.bench.summarize_runs import markdown, round_ratios, round_ratios_markdown, summarize
from scripts.bench.train_launch import REFERENCE, REPO, bench_run, samples_path
from scripts.bench.train_resume import resume_check
from scripts.bench.train_scaling import scaling

RESULT_PAGES = {f"{page}.{ext}" for page in ("summary", "scaling", "resume") for ext in ("md", "json")}


def _glue_extra(argv: list[str]) -> list[str]:
    """``--extra VALUE`` as ``--extra=VALUE`` (and ``--multi-gpu-extra``'s, ``--probe``'s): argparse
    takes a VALUE like "--compile.no-enable" for an option."""
    glued, i = [], 0
    while i < len(argv):
        if argv[i] in ("--extra", "--multi-gpu-extra", "--probe") and i + 1 < len(argv):
            glued.append(f"{argv[i]}={argv[i + 1]}")
            i += 2
        else:
            glued.append(argv[i])
            i += 1
    return glued


def bench_owned(out: str, name: str) -> bool:
    """Whether the entry ``name`` of the output folder ``out`` is one the benchmark writes: a run's log
    or GPU samples, a results page, or a run's folder (its ``.log`` beside it)."""
    return (name.endswith((".log", ".gpu.csv")) or name in RESULT_PAGES
            or os.path.isfile(os.path.join(out, name + ".log")))


def build_parser() -> argparse.ArgumentParser:
    """The command line's options (see the module docstring)."""
    parser = argparse.ArgumentParser(prog="python -m scripts.bench.train", description=__doc__.splitlines()[0])
    parser.add_argument("variants", nargs="+", help="model names, e.g. transformer parallax parallax_dagger")
    parser.add_argument("--ngpu", type=positive_int, default=1, help="GPUs per run (throughput mode)")
    parser.add_argument("--steps", type=positive_int, default=30, help="training steps per run")
    parser.add_argument("--recipe", default="muon_wsd", help="config suffix: <variant>_<recipe>.toml")
    parser.add_argument("--flavor", default="0.6B", help="model size: configs/paper/<flavor>/")
    parser.add_argument("--local-batch", type=positive_int, default=4, help="training.local_batch_size")
    parser.add_argument("--extra", default="", help="more train.py arguments, one string, applied last")
    parser.add_argument("--multi-gpu-extra", default="", metavar="EXTRA",
                        help="train.py arguments for the runs on more than one GPU only (FSDP settings, which a "
                        "one-GPU run does not read), one string, applied after --extra")
    parser.add_argument("--name-prefix", default="", help="prefix of the run names")
    parser.add_argument("--run-timeout", type=positive_int, default=420, help="seconds before a run is stopped")
    parser.add_argument("--rounds", type=positive_int, default=1,
                        help="throughput: run the variants this many times in turn (A B A B ...), runs named "
                        "<variant>_r<round>; the summary adds each variant's ratio per round, median and range")
    parser.add_argument("--out", default=os.environ.get("OUT", os.path.join(REPO, "outputs", "bench_train")),
                        help="output folder (default: $OUT, else outputs/bench_train in the repository)")
    parser.add_argument("--config", help="one config file for every variant instead of the paper configs; "
                        "the variant and --flavor are passed as --model.name and --model.flavor")
    parser.add_argument("--scaling", type=int, default=0, metavar="N",
                        help="scaling check of the first variant: 1 GPU with gradient accumulation N vs N GPUs")
    parser.add_argument("--resume", type=int, default=0, metavar="K",
                        help="resume check of the first variant: straight vs stopped at step K and rerun")
    parser.add_argument("--probe", default="", metavar="PROBES",
                        help="run train.py under scripts.bench.step_probe with these options, one string "
                        "(e.g. \"--cuda-profile-step 15\"); not for titan_qwen3")
    return parser


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """The command line, checked; ``out`` and ``config`` made absolute, and ``command`` the shell
    command that reproduces this invocation (for the results pages)."""
    argv = sys.argv[1:] if argv is None else argv
    parser = build_parser()
    args = parser.parse_args(_glue_extra(argv))
    args.out = os.path.abspath(args.out)
    try:  # each run's folder is emptied before the run: never a folder the benchmark did not write
        check_output_folder(args.out, "--out", lambda name: bench_owned(args.out, name),
                            "the runs and pages of an earlier benchmark", "whose runs of the same names are replaced")
    except ValueError as exc:
        parser.error(str(exc))
    args.config = args.config and os.path.abspath(args.config)
    args.command = command_line(__spec__.name, argv)
    if args.scaling:
        if args.scaling < 2:
            parser.error(f"--scaling {args.scaling}: expected a number of GPUs >= 2")
        if len(args.variants) > 1 or args.ngpu != 1:
            parser.error("--scaling measures one variant on 1 and N GPUs; give one variant and no --ngpu")
    if args.probe:
        if REFERENCE in args.variants:
            parser.error(f"--probe runs our train.py; {REFERENCE} is TorchTitan's trainer")
        from scripts.bench.step_probe import parse_args as parse_probes

        probes, _ = parse_probes([*shlex.split(args.probe), "--"])  # a bad probe stops here, naming it
        if probes.cuda_profile_step and probes.cuda_profile_step > args.steps:
            parser.error(f"--probe: --cuda-profile-step {probes.cuda_profile_step} is past the last step "
                         f"(--steps {args.steps}): no step would be profiled")
    if args.rounds > 1 and (args.scaling or args.resume):
        parser.error(f"--rounds {args.rounds}: repeats the throughput runs; expected it without --scaling and --resume")
    if args.resume and not (0 < args.resume < args.steps and len(args.variants) == 1 and not args.scaling):
        parser.error(f"--resume {args.resume}: expected one variant, no --scaling and 0 < K < --steps ({args.steps})")
    if args.multi_gpu_extra and not (args.scaling or (args.ngpu > 1 and not args.resume)):
        parser.error(f"--multi-gpu-extra {args.multi_gpu_extra!r}: every run of this command has one GPU "
                     "(it would reach none); expected --scaling N or --ngpu N > 1 without --resume")
    return args


def run_name(args: argparse.Namespace, variant: str, round_: int) -> str:
    """A throughput run's name: ``<prefix><variant>``, with ``_r<round>`` (from 1) under ``--rounds`` > 1."""
    return args.name_prefix + variant + (f"_r{round_}" if args.rounds > 1 else "")


def throughput(args: argparse.Namespace) -> int:
    """Run every variant on ``--ngpu`` GPUs, ``--rounds`` times in turn, and write OUT/summary.{md,json};
    the exit status."""
    skip = args.steps // 2

    def summary(folder: str | None) -> dict | None:
        return folder and {**summarize(folder, skip), "gpu": summarize_file(samples_path(folder))}

    rounds = [[summary(bench_run(args, v, run_name(args, v, k), args.ngpu)) for v in args.variants]
              for k in range(1, args.rounds + 1)]
    rows = [row for runs in rounds for row in runs if row]
    if rows:
        measured = (f"tokens/s per GPU, MFU and peak memory of {', '.join(args.variants)} ({args.flavor}, "
                    f"{args.config or args.recipe}), {args.steps} steps on {args.ngpu} GPU(s) each"
                    f"{f', {args.rounds} rounds of the variants in turn' if args.rounds > 1 else ''}, means over the "
                    f"steps after {skip}; ratios against {rows[0]['run']}")
        meta = describe("Training throughput", measured, args.command)
        body, data = markdown(rows, rows[0]["run"]), {"runs": rows}
        if args.rounds > 1:
            data["round_ratios"] = round_ratios(rounds, args.variants)
            body += "\n" + round_ratios_markdown(data["round_ratios"], args.variants[0])
        print(write_results(os.path.join(args.out, "summary"), meta, body, data))
    return 0 if all(all(runs) for runs in rounds) else 1


def main(argv: list[str] | None = None) -> int:
    """Run the benchmark the command line asks for; the exit status (1 when a run failed)."""
    args = parse_args(argv)
    os.makedirs(args.out, exist_ok=True)
    if args.resume:
        return resume_check(args)
    return scaling(args) if args.scaling else throughput(args)


if __name__ == "__main__":
    sys.exit(main())
