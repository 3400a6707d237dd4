"""Checkpoint save and load time with and without checksums, and the 1.7B save time it implies.

Reproduce (one H200; about 2 minutes), writing docs/bench/checkpoint.md and .json:
    python -m scripts.bench.checkpoint --out docs/bench/checkpoint

The state (``--config``, default the Parallax 0.6B paper recipe, Muon + WSD) is what the trainer
saves: fp32 weights,
Muon momentum and Adam moments after one optimizer step, the lr schedule and a step counter, on
the GPU. Three ways to save it, each through a checkpoint manager's public ``save``:

* ``torchtitan``: TorchTitan 0.2.2's CheckpointManager (plain DCP into ``step-N``);
* ``atomic``: ours with ``checkpoint.verify = false`` (DCP into ``.partial-N``, settings, rename);
* ``checksums``: ours with ``checkpoint.verify = true`` (plus each file hashed and the manifest).

Background saves (``checkpoint.async_mode``, with checksums; pinned memory where it can save): how long
each save holds the caller (the ``save`` call, plus for pinned memory the wait for its staging that
the trainer makes before the next optimizer step) and when its step folder is published, beside the
synchronous save with checksums, and whether the last one's checksums hold.

Every kind saves once before the ``--iters`` saves its medians count, timed apart: a first save
pays one-time costs (DCP's planning, the background saves' process group) and took 1.5-2x longer.

Loads (``load(step)``) of the plain and the checksummed checkpoint are timed from a cold page cache
(the files evicted with ``posix_fadvise``) and warm. The 1.7B estimate scales the measured save
time by the predicted checkpoint bytes (weights + Muon momentum + Adam moments, fp32), a
prediction checked against the 0.6B file sizes on the page. Checkpoints go to ``--dir`` (default: a
temporary folder, deleted at the end; about 2 x 7 GB at a time), one folder per kind, deleted after
its timings: a ``--dir`` that holds anything else is refused before the state is built.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shutil
import statistics
import sys
import tempfile
import time

import torch
from torch.distributed.checkpoint.stateful import Stateful

from parallax_titan.checksums import content_problems, default_algorithm, read_manifest
from scripts.bench.results import command_line, describe, positive_int, table, write_result_page

RECIPE = "configs/paper/{flavor}/parallax_muon_wsd.toml"
BYTES_PER_VALUE = 4  # fp32 weights and optimizer state
STATE_VALUES = {"muon": 1, "adamw": 2}  # momentum; first and second moments
SHUTDOWN_TIMEOUT_REF = "parallax_titan.launch.SHUTDOWN_TIMEOUT_S"
SYNC_KINDS = ("torchtitan", "atomic", "checksums")  # the three ways of the module docstring
BACKGROUND = ("async", "async_with_pinned_mem")  # checkpoint.async_mode values timed as a trainer sees them


class StepCounter(Stateful):
    """A step counter standing in for a trainer's states (train state, data loader position; in
    tests also the optimizer and schedules)."""

    def __init__(self) -> None:
        self.step = 0

    def state_dict(self):
        return {"step": self.step}

    def load_state_dict(self, state_dict) -> None:
        self.step = state_dict["step"]


def job_config(config: str, dump: str, verify: bool, async_mode: str = "disabled"):
    """The config at ``config`` (tiny tokenizer: the model's size does not depend on it), saving at
    every step."""
    from parallax_titan.config import load_config

    return load_config(["--job.config_file", config, "--job.dump_folder", dump,
                        "--model.hf_assets_path", "./parallax_titan/assets/tokenizer/tiny",
                        "--checkpoint.keep_latest_k", "0", f"--checkpoint.{'' if verify else 'no-'}verify",
                        "--checkpoint.interval", "1", "--checkpoint.async_mode", async_mode],
                       check_data=False)


def build_state(config: str, device: str):
    """Model, optimizers and lr schedulers of ``config`` after one optimizer step with random gradients."""
    from parallax_titan.model import ParallaxQwen3Model
    from parallax_titan.optim_builder import build_lr_schedulers, build_optimizers
    from parallax_titan.spec import model_args_for

    cfg = job_config(config, tempfile.gettempdir(), True)
    with torch.device(device):
        model = ParallaxQwen3Model(model_args_for(cfg))
    with torch.no_grad():
        model.init_weights(buffer_device=torch.device(device))
    optimizers = build_optimizers([model], cfg.optimizer, None)
    schedulers = build_lr_schedulers(optimizers, cfg.lr_scheduler, cfg.training.steps)
    for p in model.parameters():
        p.grad = torch.randn_like(p) * 1e-3
    optimizers.step()
    schedulers.step()
    optimizers.zero_grad()
    return model, optimizers, schedulers


def manager(kind: str, config: str, dump: str, model, optimizers, schedulers):
    """A checkpoint manager of ``kind`` (torchtitan, atomic, checksums, or a background mode of
    BACKGROUND, with checksums) saving into ``dump``."""
    from torchtitan.components.checkpoint import CheckpointManager

    from parallax_titan.checkpointing import ParallaxCheckpointManager

    cls = CheckpointManager if kind == "torchtitan" else ParallaxCheckpointManager
    cfg = job_config(config, dump, kind not in ("torchtitan", "atomic"), kind if kind in BACKGROUND else "disabled")
    return cls(dataloader=StepCounter(), model_parts=[model], optimizers=optimizers, lr_schedulers=schedulers,
               states={"train_state": StepCounter()}, checkpoint_config=cfg.checkpoint, sd_adapter=None,
               base_folder=dump)


def evict(folder: str) -> None:
    """Drop the files of ``folder`` from the page cache (they are written and fsynced: clean pages)."""
    for name in os.listdir(folder):
        fd = os.open(os.path.join(folder, name), os.O_RDONLY)
        try:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)


def sync(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


def timed(fn, device: str) -> float:
    sync(device)
    begin = time.perf_counter()
    fn()
    sync(device)
    return time.perf_counter() - begin


def step_folder(mgr, step: int) -> str:
    return os.path.join(mgr.folder, f"step-{step}")


def folder_bytes(folder: str) -> int:
    return sum(os.path.getsize(os.path.join(folder, n)) for n in os.listdir(folder))


def predicted_bytes(config: str) -> int:
    """Checkpoint bytes of ``config``'s run: every state-dict tensor of the model (tied weights
    appear under both names) and the optimizer state of its Muon and Adam groups, fp32."""
    from optimizers.routing import build_param_groups
    from parallax_titan.model import ParallaxQwen3Model
    from parallax_titan.optim_builder import routing_config
    from parallax_titan.spec import model_args_for

    cfg = job_config(config, tempfile.gettempdir(), True)
    with torch.device("meta"):
        model = ParallaxQwen3Model(model_args_for(cfg))
    weights = sum(t.numel() for t in model.state_dict().values())
    groups = build_param_groups(model, routing_config(cfg.optimizer, model))
    state = sum(STATE_VALUES[g["algo"]] * sum(p.numel() for p in g["params"]) for g in groups)
    return (weights + state) * BYTES_PER_VALUE


def bench(args, device: str) -> dict:
    """Every timing of the module docstring, as lists of seconds."""
    from parallax_titan.compat import pinned_memory_saves_problem

    model, optimizers, schedulers = build_state(args.config, device)
    root = args.dir or tempfile.mkdtemp(prefix="bench_checkpoint_")
    out = {"first_save_s": {}, "save_s": {}, "load_s": {}, "verify_s": {"cold": [], "warm": []}}
    try:
        for kind in SYNC_KINDS:
            mgr = manager(kind, args.config, os.path.join(root, kind), model, optimizers, schedulers)
            first, *later = [timed(lambda s=s: mgr.save(curr_step=s, last_step=True), device)
                             for s in range(args.iters + 1)]
            out["first_save_s"][kind], out["save_s"][kind] = first, later
            out["checkpoint_bytes"] = folder_bytes(step_folder(mgr, 1))
            print(kind, "save", first, later, flush=True)
            if kind != "atomic":
                out["load_s"][kind] = {"cold": [], "warm": []}
                for cache in ("cold", "warm"):
                    for _ in range(args.iters):
                        if cache == "cold":
                            evict(step_folder(mgr, args.iters))
                        out["load_s"][kind][cache].append(timed(lambda: mgr.load(step=args.iters), device))
                print(kind, "load", out["load_s"][kind], flush=True)
            if kind == "checksums":
                path = step_folder(mgr, args.iters)
                out["files"] = len(read_manifest(path).files)
                for cache in ("cold", "warm"):
                    if cache == "cold":
                        evict(path)
                    out["verify_s"][cache].append(timed(lambda: content_problems(path, read_manifest(path),
                                                                                 threads=args.threads), "cpu"))
            mgr.close()
            shutil.rmtree(os.path.join(root, kind), ignore_errors=True)
        out["pinned_problem"] = pinned_memory_saves_problem()
        kinds = BACKGROUND if out["pinned_problem"] is None else BACKGROUND[:1]
        out["background"] = background(kinds, args, device, model, optimizers, schedulers, root)
    finally:
        if not args.dir:
            shutil.rmtree(root, ignore_errors=True)
    return out


@contextlib.contextmanager
def one_rank_group(root: str):
    """A one-process group while in this block (TorchTitan's background saves make a gloo group of
    their own); an existing group is used as it is."""
    import torch.distributed as dist

    if dist.is_initialized():
        yield
        return
    dist.init_process_group("gloo", init_method=f"file://{os.path.join(root, 'store')}", rank=0, world_size=1)
    try:
        yield
    finally:
        dist.destroy_process_group()


def wait_for(path: str, poll_s: float = 0.005, timeout_s: float = 600.0) -> None:
    """Until ``path`` exists (a background save's step folder appears when it is published);
    TimeoutError after ``timeout_s`` (a failed save never publishes it)."""
    deadline = time.monotonic() + timeout_s
    while not os.path.isdir(path):
        if time.monotonic() > deadline:
            raise TimeoutError(f"{path!r} did not appear within {timeout_s:.0f} s: the background save failed?")
        time.sleep(poll_s)


def background(kinds, args, device: str, model, optimizers, schedulers, root: str) -> dict:
    """Per background mode of ``kinds``: seconds each save held the caller (the save call, and for
    pinned memory the wait for its staging that the trainer makes before the next optimizer step)
    and seconds until its step folder was published, as lists."""
    with one_rank_group(root):
        return {kind: background_saves(kind, args, device, model, optimizers, schedulers, root) for kind in kinds}


def background_saves(kind: str, args, device: str, model, optimizers, schedulers, root: str) -> dict:
    """A first and ``args.iters`` more background saves of ``kind``: held and published seconds, and
    the problems of the last step's checksums."""
    mgr = manager(kind, args.config, os.path.join(root, kind), model, optimizers, schedulers)
    held, published = [], []
    for step in range(args.iters + 1):
        begin = time.perf_counter()
        held.append(timed(lambda s=step: (mgr.save(curr_step=s), mgr.maybe_wait_for_staging()), device))
        wait_for(step_folder(mgr, step))
        published.append(time.perf_counter() - begin)
    last = step_folder(mgr, args.iters)
    out = {"first_held_s": held[0], "first_published_s": published[0], "held_s": held[1:],
           "published_s": published[1:], "problem": content_problems(last, read_manifest(last), threads=args.threads)}
    print(kind, out, flush=True)
    mgr.close()
    shutil.rmtree(os.path.join(root, kind), ignore_errors=True)
    return out


def summarize(result: dict) -> None:
    """Medians, overheads and the 1.7B estimate into ``result``."""
    from parallax_titan.launch import SHUTDOWN_TIMEOUT_S

    med = {kind: statistics.median(times) for kind, times in result["save_s"].items()}
    load = {kind: {c: statistics.median(t) for c, t in caches.items()} for kind, caches in result["load_s"].items()}
    result["median_save_s"], result["median_load_s"] = med, load
    result["save_overhead_pct"] = 100 * (med["checksums"] / med["torchtitan"] - 1)
    result["load_overhead_pct"] = {c: 100 * (load["checksums"][c] / load["torchtitan"][c] - 1)
                                   for c in ("cold", "warm")}
    ratio = result["predicted_bytes"]["1.7B"] / result["predicted_bytes"]["measured"]
    result["save_1.7B_estimate_s"] = med["checksums"] * ratio
    result["shutdown_timeout_s"] = SHUTDOWN_TIMEOUT_S


def write(result: dict, out: str) -> None:
    summarize(result)
    gb = result["checkpoint_bytes"] / 1e9
    lines = [f"State: `{result['config']}` ({result['flavor']}), {gb:.2f} GB on disk "
             f"({result['predicted_bytes']['measured'] / 1e9:.2f} GB predicted from the parameter counts), "
             f"{result['files']} files; checksums {result['algorithm']} in {result['threads']} threads.", ""]
    lines += table(["save", "first save (s)", "median of the later saves (s)", "later saves (s)"],
                   ((k, f"{result['first_save_s'][k]:.2f}", f"{result['median_save_s'][k]:.2f}",
                     ", ".join(f"{t:.2f}" for t in v)) for k, v in result["save_s"].items()))
    lines += ["", f"Checksums add {result['save_overhead_pct']:.1f}% to a save (goal: under 10%).", ""]
    lines += table(["load", "cold cache (s)", "warm cache (s)"],
                   ((k, f"{v['cold']:.2f}", f"{v['warm']:.2f}") for k, v in result["median_load_s"].items()))
    verify = {c: statistics.median(t) for c, t in result["verify_s"].items()}
    extra = result["load_overhead_pct"]
    lines += ["", f"Checksum check alone: {verify['cold']:.2f} s cold, {verify['warm']:.2f} s warm. Checksums add "
              f"{extra['cold']:.1f}% (cold) and {extra['warm']:.1f}% (warm) to a load.", "",
              f"1.7B: {result['predicted_bytes']['1.7B'] / 1e9:.1f} GB predicted, so a save with checksums takes about "
              f"{result['save_1.7B_estimate_s']:.0f} s on this disk; the launcher's shutdown timeout "
              f"({SHUTDOWN_TIMEOUT_REF}) is {result['shutdown_timeout_s']} s.", ""]
    lines += background_lines(result)
    write_result_page(out, result, lines)


def background_lines(result: dict) -> list[str]:
    """The background saves' table: how long each held training against the synchronous save."""
    sync_s = result["median_save_s"]["checksums"]
    rows = [(f"`{kind}`", f"{r['first_held_s']:.2f}", f"{statistics.median(r['held_s']):.2f}",
             f"{statistics.median(r['held_s']) / sync_s:.3f}", f"{statistics.median(r['published_s']):.2f}",
             "valid" if not r["problem"] else str(r["problem"])) for kind, r in result["background"].items()]
    return (table(["background save (checksums)", "first save held (s)", "later saves held (median s)",
                   "x synchronous save", "published after (median s)", "last step's checksums"], rows)
            + ["", f"Synchronous save with checksums in the same run: {sync_s:.2f} s."]
            + ([f"`async_with_pinned_mem` not timed: it {result['pinned_problem']}."]
               if result["pinned_problem"] else []))


def kind_folder(root: str, name: str) -> bool:
    """Whether the entry ``name`` of ``--dir`` is a kind's folder that an earlier run left: a kind's name
    (:data:`SYNC_KINDS`, :data:`BACKGROUND`), holding its ``checkpoint`` folder only."""
    path = os.path.join(root, name)
    return name in (*SYNC_KINDS, *BACKGROUND) and os.path.isdir(path) and set(os.listdir(path)) <= {"checkpoint"}


def main(argv: list[str] | None = None) -> None:
    """Run the benchmark and write OUT.md and OUT.json."""
    from parallax_titan.checkpoint_files import check_output_folder
    from parallax_titan.checkpointing import checksum_threads
    from parallax_titan.config import ConfigError
    from parallax_titan.spec import register_all

    argv = sys.argv[1:] if argv is None else argv
    ap = argparse.ArgumentParser(prog="python -m scripts.bench.checkpoint", description=__doc__.split("\n")[0])
    ap.add_argument("--config", default=RECIPE.format(flavor="0.6B"), help="the run whose state is saved")
    ap.add_argument("--iters", type=positive_int, default=2, help="saves (after the first) and loads of each kind")
    ap.add_argument("--threads", type=positive_int, default=checksum_threads(),
                    help="hashing threads of the check alone")
    ap.add_argument("--dir", default="", help="where checkpoints go (default: a temporary folder)")
    ap.add_argument("--out", default="docs/bench/checkpoint", help="output path without extension")
    args = ap.parse_args(argv)
    register_all()
    device = "cuda" if torch.cuda.is_available() else "cpu"
    try:  # before the state is built and saved
        flavor = job_config(args.config, tempfile.gettempdir(), True).model.flavor
    except ConfigError as exc:
        ap.error(f"--config: {exc}")
    try:  # each kind's folder in --dir is deleted after its timings: never one of the user's
        if args.dir:
            check_output_folder(args.dir, "--dir", lambda name: kind_folder(args.dir, name),
                                "the checkpoint folders of this benchmark", "whose folders are deleted")
    except ValueError as exc:
        ap.error(str(exc))
    measured = (f"checkpoint save and load seconds (median of {args.iters}) of the training state of "
                f"{args.config}: TorchTitan's plain DCP save, ours atomic, ours with checksums, ours in the "
                "background")
    result = {"meta": describe("Checkpoint save and load, with and without checksums, in the background", measured,
                               command_line(__spec__.name, argv)),
              "config": args.config, "flavor": flavor, "algorithm": default_algorithm(), "threads": args.threads,
              "predicted_bytes": {"measured": predicted_bytes(args.config),
                                  "1.7B": predicted_bytes(RECIPE.format(flavor="1.7B"))}}
    result.update(bench(args, device))
    write(result, args.out)
    print(open(args.out + ".md").read())


if __name__ == "__main__":
    main()
