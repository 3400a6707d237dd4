"""Every loader of a checkpoint outside the trainer's resume checks the folder against its checksum
manifest before it reads a weight: evaluation (``eval.checkpoint``, ParallaxLM and lm-eval's
``model_args``, ``python -m eval.lm_eval``, ``[eval] at_end``), ``scripts/generate.py``,
``scripts/export_hf.py export``, ``scripts/analyze.py`` and up-training
(``parallax.init_from_transformer``, also on two ranks). A flipped byte, a truncated file and a
folder without a manifest are refused naming the entry point's option, the file and its off switch;
the off switch loads the same folder; an intact folder loads the saved weights."""

from __future__ import annotations

import dataclasses
import os
import shutil
import socket
import time

import pytest
import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
import torch.multiprocessing as mp
from torch.distributed.checkpoint import FileSystemReader

import eval.lm_eval as lm_eval_cli
from eval.at_end import run_at_end
from eval.checkpoint import build_model, load_checkpoint, load_job_config, load_model, model_args_of
from eval.model import ParallaxLM
from parallax_titan.checkpoint_files import CheckpointError, folder_problem, verify_before_load
from parallax_titan.checkpointing import save_checksummed
from parallax_titan.checksums import MANIFEST_FILE
from parallax_titan.diagnostics.report import load_checkpoint_model
from parallax_titan.model import ParallaxQwen3Model
from parallax_titan.teardown import leave_process_group
from parallax_titan.uptrain import load_transformer_weights
from scripts import analyze, export_hf, generate
from tests._train_runs import REPO

DATA = "__0_0.distcp"  # the one data file of a one-process save
SMALL_MODEL = "dim = 64\nn_heads = 4\nn_kv_heads = 2\nhead_dim = 16\nhidden_dim = 96\n"


class Loaded(Exception):
    """Raised in place of the work after a load (scoring, analysis): the load itself succeeded."""


def raise_loaded(loaded, *args, **kwargs):
    raise Loaded(loaded)


@pytest.fixture(scope="module")
def config(tmp_path_factory) -> str:
    """The 2-layer test config with a narrower model (keeps every load fast)."""
    text = open(os.path.join(REPO, "configs", "test_cpu_2rank.toml")).read().replace("[model]\n",
                                                                                     "[model]\n" + SMALL_MODEL, 1)
    path = str(tmp_path_factory.mktemp("config") / "small.toml")
    with open(path, "w") as f:
        f.write(text)
    return path


@pytest.fixture(scope="module")
def saved(config, tmp_path_factory) -> dict[str, tuple[str, dict]]:
    """variant -> (checksummed DCP folder of the config's model, its weights)."""
    root = tmp_path_factory.mktemp("saved")
    out = {}
    for seed, variant in enumerate(("parallax", "transformer")):
        torch.manual_seed(seed)
        model = build_model(model_args_of(load_job_config(config, ["--model.name", variant])), torch.device("cpu"))
        path = str(root / variant)
        save_checksummed(model.state_dict(), path)
        out[variant] = (path, {k: v.clone() for k, v in model.state_dict().items()})
    return out


def flip_inside(path: str, name: str) -> None:
    """Invert one byte in the middle of tensor ``name``'s stored bytes (DCP still reads the file)."""
    info = next(v for k, v in FileSystemReader(path).read_metadata().storage_data.items() if k.fqn == name)
    with open(os.path.join(path, info.relative_path), "r+b") as f:
        f.seek(info.offset + info.length // 2)
        byte = f.read(1)
        f.seek(-1, os.SEEK_CUR)
        f.write(bytes([byte[0] ^ 0xFF]))


def damage(path: str, kind: str) -> None:
    if kind == "flipped":
        flip_inside(path, "tok_embeddings.weight")
    elif kind == "truncated":
        os.truncate(os.path.join(path, DATA), os.path.getsize(os.path.join(path, DATA)) // 2)
    elif kind == "no manifest":
        os.remove(os.path.join(path, MANIFEST_FILE))


@pytest.fixture
def dcp_loads(monkeypatch) -> list[str]:
    """The folders ``dcp.load`` reads during the test (it still loads them)."""
    calls, original = [], dcp.load

    def spy(*args, **kwargs):
        calls.append(str(kwargs.get("checkpoint_id")))
        return original(*args, **kwargs)

    monkeypatch.setattr(dcp, "load", spy)
    return calls


def refuse_with_rc(rc: int, capsys) -> None:
    """A command's exit: 4 with its stderr raised as CheckpointError (as a Python loader raises it)."""
    err = capsys.readouterr().err
    if rc == 4:
        raise CheckpointError(err)
    assert rc == 0, err


# Each entry point: (the variant it loads, its option, its off switch, load(ctx, path, verify) -> weights or None).
def _load_model(ctx, path, verify):
    return load_model(load_job_config(ctx.config), path, device="cpu", verify=verify)[0].state_dict()


def _load_checkpoint(ctx, path, verify):
    model = build_model(model_args_of(load_job_config(ctx.config)), torch.device("cpu"))
    load_checkpoint(model, path, verify)
    return model.state_dict()


def _from_checkpoint(ctx, path, verify):
    return ParallaxLM.from_checkpoint(ctx.config, path, device="cpu", verify=verify).model.state_dict()


def _model_args(ctx, path, verify):
    arg_string = f"config={ctx.config},checkpoint={path},device=cpu" + ("" if verify else ",verify=false")
    return ParallaxLM.create_from_arg_string(arg_string).model.state_dict()


def _lm_eval_cli(ctx, path, verify):
    ctx.monkeypatch.setattr(lm_eval_cli, "evaluate", raise_loaded)
    argv = ["--config", ctx.config, "--checkpoint", path, "--output", str(ctx.tmp_path / "out"), "--tasks", "boolq",
            "--device", "cpu"] + ([] if verify else ["--no-verify"])
    try:
        refuse_with_rc(lm_eval_cli.main(argv), ctx.capsys)
    except Loaded as loaded:
        return loaded.args[0].model.state_dict()
    raise AssertionError("python -m eval.lm_eval scored nothing")


def _at_end(ctx, path, verify):
    ctx.monkeypatch.setattr(lm_eval_cli, "evaluate", raise_loaded)  # run_at_end imports it when called
    job = load_job_config(ctx.config, ["--job.dump_folder", str(ctx.tmp_path)] + ([] if verify else
                                                                                   ["--checkpoint.no-verify"]))
    with pytest.raises(Loaded) as loaded:
        run_at_end(job, path)
    return loaded.value.args[0].model.state_dict()


def _generate(ctx, path, verify):
    argv = ["--config", ctx.config, "--checkpoint", path, "--device", "cpu", "--prompt", "Once", "--max-new-tokens",
            "2"] + ([] if verify else ["--no-verify"])
    refuse_with_rc(generate.main(argv), ctx.capsys)


def _export(ctx, path, verify):
    argv = ["export", "--config", ctx.config, "--checkpoint", path, "--output", str(ctx.tmp_path / "hf"),
            "--no-tokenizer"] + ([] if verify else ["--no-verify"])
    refuse_with_rc(export_hf.main(argv), ctx.capsys)
    assert os.path.isfile(ctx.tmp_path / "hf" / "model.safetensors")


def _analyze(ctx, path, verify):
    ctx.monkeypatch.setattr(analyze, "collect", raise_loaded)
    with pytest.raises(Loaded) as loaded:
        analyze.main(["--config", ctx.config, "--checkpoint", path, "--out", str(ctx.tmp_path / "analysis"),
                      "--seq-len", "16"] + ([] if verify else ["--no-verify"]))
    return loaded.value.args[0].state_dict()


def _analyze_model(ctx, path, verify):
    return load_checkpoint_model(load_job_config(ctx.config), path, verify).state_dict()


def _uptrain(ctx, path, verify):
    model = ParallaxQwen3Model(model_args_of(load_job_config(ctx.config)))
    with torch.no_grad():
        model.init_weights()
    load_transformer_weights(model, path, verify)
    return {k: v for k, v in model.state_dict().items() if k in ctx.reference}


ENTRY_POINTS = {
    "eval.checkpoint.load_model": ("parallax", "checkpoint", "verify=False", _load_model),
    "eval.checkpoint.load_checkpoint": ("parallax", "checkpoint", "verify=False", _load_checkpoint),
    "ParallaxLM.from_checkpoint": ("parallax", "checkpoint", "verify=False", _from_checkpoint),
    "lm-eval model_args": ("parallax", "model_args checkpoint", "verify=false in model_args", _model_args),
    "python -m eval.lm_eval": ("parallax", "--checkpoint", "--no-verify", _lm_eval_cli),
    "eval.at_end": ("parallax", "eval.at_end", "checkpoint.verify = false", _at_end),
    "scripts.generate": ("parallax", "--checkpoint", "--no-verify", _generate),
    "scripts.export_hf export": ("parallax", "--checkpoint", "--no-verify", _export),
    "scripts.analyze": ("parallax", "--checkpoint", "--no-verify", _analyze),
    "diagnostics load_checkpoint_model": ("parallax", "--checkpoint", "--no-verify", _analyze_model),
    "parallax.init_from_transformer": ("transformer", "parallax.init_from_transformer", "checkpoint.verify = false",
                                       _uptrain),
}


@dataclasses.dataclass
class Context:
    config: str
    tmp_path: object
    monkeypatch: object
    capsys: object
    reference: dict


@pytest.fixture(params=list(ENTRY_POINTS))
def entry(request, config, saved, tmp_path, monkeypatch, capsys):
    """(context, a copy of the entry point's checkpoint, option, off switch, load)."""
    variant, who, off_switch, load = ENTRY_POINTS[request.param]
    path = str(tmp_path / "step-1")
    shutil.copytree(saved[variant][0], path)
    return Context(config, tmp_path, monkeypatch, capsys, saved[variant][1]), path, who, off_switch, load


def equal_weights(loaded: dict | None, reference: dict) -> bool:
    return loaded is None or all(torch.equal(loaded[k], v) for k, v in reference.items() if k in loaded)


@pytest.mark.parametrize("kind", ["flipped", "truncated"])
def test_a_damaged_file_is_refused_before_any_weight_is_read(entry, kind, dcp_loads):
    ctx, path, who, off_switch, load = entry
    damage(path, kind)
    with pytest.raises(CheckpointError) as info:
        load(ctx, path, True)
    message = str(info.value)
    assert f"{who}: {path!r} is not a valid checkpoint: {os.path.join(path, DATA)}: " in message
    assert ("bytes 0-" in message and "(corrupted)" in message) if kind == "flipped" else "(truncated)" in message
    assert f"({off_switch} loads it unchecked)" in message
    assert dcp_loads == []


def test_the_off_switch_loads_a_damaged_file_unchecked(entry, dcp_loads):
    ctx, path, who, off_switch, load = entry
    damage(path, "flipped")
    loaded = load(ctx, path, False)
    assert path in dcp_loads
    if loaded is not None:
        assert not torch.equal(loaded["tok_embeddings.weight"], ctx.reference["tok_embeddings.weight"])


def test_a_folder_without_manifest_is_refused_unless_verify_is_off(entry, dcp_loads):
    ctx, path, who, off_switch, load = entry
    damage(path, "no manifest")
    with pytest.raises(CheckpointError) as info:
        load(ctx, path, True)
    message = str(info.value)
    assert f"{who}: {path!r} is not a valid checkpoint: {os.path.join(path, MANIFEST_FILE)!r} does not exist, so its " \
           "files cannot be checked (saved with checkpoint.verify = false or by another program)" in message
    assert f"({off_switch} loads it unchecked)" in message and dcp_loads == []
    assert equal_weights(load(ctx, path, False), ctx.reference) and path in dcp_loads


def test_an_intact_checkpoint_loads_its_weights(entry, dcp_loads):
    ctx, path, who, off_switch, load = entry
    loaded = load(ctx, path, True)
    assert path in dcp_loads and equal_weights(loaded, ctx.reference)


def test_model_args_verify_takes_true_or_false_only(config, saved):
    path = saved["parallax"][0]
    assert ParallaxLM.create_from_arg_string(f"config={config},checkpoint={path},device=cpu,verify=TRUE").model
    for value, shown in (("0", "0"), ("yes", "yes"), ("none", "None")):
        with pytest.raises(ValueError, match=rf"model_args: verify={shown} is not a boolean; expected verify=true or"):
            ParallaxLM.create_from_arg_string(f"config={config},checkpoint={path},device=cpu,verify={value}")
    with pytest.raises(ValueError, match="verify=maybe is not a boolean"):
        ParallaxLM.create_from_arg_string(f"config={config},checkpoint={path},device=cpu,verify='maybe'")


def test_no_checkpoint_at_all_keeps_the_loaders_own_error(config, tmp_path):
    """A missing folder, or the folder above the steps, is no checkpoint: the loader says so."""
    verify_before_load(str(tmp_path / "absent"), "--checkpoint", "--no-verify")
    with pytest.raises(ValueError, match="checkpoint: .* is not a directory"):
        load_model(load_job_config(config), str(tmp_path / "absent"), device="cpu")


def test_analyze_checks_every_checkpoint_before_any_work(config, saved, tmp_path, monkeypatch):
    compare = str(tmp_path / "transformer")
    shutil.copytree(saved["transformer"][0], compare)
    damage(compare, "flipped")
    # the held-out batch (seconds) may come before the checksums (minutes); loading a model may not
    monkeypatch.setattr(analyze, "load_checkpoint_model", lambda *a, **k: pytest.fail("work before the check"))
    with pytest.raises(CheckpointError, match=rf"--compare: {compare!r} is not a valid checkpoint: .*{DATA}: bytes"):
        analyze.main(["--config", config, "--checkpoint", saved["parallax"][0], "--compare", compare])


def test_ranks_share_the_hashing_and_agree(saved, tmp_path):
    """Rank r of w hashes every w-th listed file; every rank returns the first problem of all."""
    path = str(tmp_path / "step-1")
    shutil.copytree(saved["parallax"][0], path)
    damage(path, "flipped")  # the data file: the second file of the sorted manifest, rank 1's share
    shares = {}

    def gather_for(rank):
        def gather(local):
            shares[rank] = local
            return [shares.get(r, []) for r in range(2)]
        return gather

    assert folder_problem(path, rank=0, world=2, gather=gather_for(0)) is None  # .metadata alone: intact
    expected = folder_problem(path)
    assert folder_problem(path, rank=1, world=2, gather=gather_for(1)) == expected and DATA in expected
    assert folder_problem(path, rank=0, world=2, gather=gather_for(0)) == expected  # now with rank 1's result


def _uptrain_worker(rank, world, port, args, path, out):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world)
    try:
        try:
            load_transformer_weights(ParallaxQwen3Model(args), path)
            result = "loaded"
        except CheckpointError as exc:
            result = str(exc)
        with open(os.path.join(out, f"rank{rank}"), "w") as f:
            f.write(result)
        dist.barrier()  # a rank left in a collective would never get here
    finally:
        leave_process_group(wait_s=30)


@pytest.mark.slow  # two torchrun ranks
def test_two_ranks_refuse_a_corrupt_transformer_checkpoint_together(config, saved, tmp_path):
    """The damaged file is in rank 1's share; rank 0 raises the same error instead of loading."""
    path = str(tmp_path / "step-1")
    shutil.copytree(saved["transformer"][0], path)
    damage(path, "flipped")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    args = model_args_of(load_job_config(config))
    context = mp.spawn(_uptrain_worker, args=(2, port, args, path, str(tmp_path)), nprocs=2, join=False)
    deadline = time.monotonic() + 300
    while not context.join(timeout=5):
        if time.monotonic() > deadline:
            for process in context.processes:
                process.kill()
            pytest.fail("a rank hung")
    messages = [open(tmp_path / f"rank{r}").read() for r in range(2)]
    assert messages[0] == messages[1]
    assert messages[0].startswith(f"parallax.init_from_transformer: {path!r} is not a valid checkpoint: "
                                  f"{os.path.join(path, DATA)}: bytes 0-")
