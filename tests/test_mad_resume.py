"""MAD runs that resume mid-run: a run killed after a save and run again ends bit for bit as the
uninterrupted run; the grid continues its partial runs first and clears their files; another run's
state is refused, an unreadable one is started over, and a save cut short keeps the previous state."""

import dataclasses
import json
import os

import pytest
import torch

from eval.mad import runner, training
from eval.mad.__main__ import main
from eval.mad.grid import TrainConfig, load_config
from eval.mad.models import build_model, compile_blocks
from eval.mad.tasks import TaskSetting, make_dataset

SETTING = TaskSetting("in-context-recall", 16, 32, num_train_examples=64, num_test_examples=32, seed=1)
SCORED = ("test_acc", "test_acc_micro", "test_acc_macro_all", "final_loss", "steps", "planned_steps")
SETTING_LABEL = SETTING.label()  # ICR(vocab_size=16,seq_len=32,num_train_examples=64)
IDENTITY = {"setting": SETTING_LABEL, "mixer": "attention", "lr": 5e-3, "weight_decay": 0.1, "config_id": "c"}


class Killed(Exception):
    """Stands in for the kill at a call's wall-clock limit."""


def kill_after(patch, saves: int) -> None:
    """Makes the run die right after its ``saves``-th save of its state."""
    real, count = training._save_run_state, [0]

    def save(path, state):
        real(path, state)
        count[0] += 1
        if count[0] == saves:
            raise Killed

    patch.setattr(training, "_save_run_state", save)


def run(cfg: TrainConfig, checkpoint=None, identity=IDENTITY):
    """(record, model) of the tiny attention run on SETTING: 4 steps per epoch."""
    model = build_model(SETTING.task, "attention", 16, 32, dim=32, n_heads=4, hidden_dim=64)
    record = training.train_and_evaluate(model, make_dataset(SETTING), cfg, lr=identity["lr"],
                                         weight_decay=identity["weight_decay"], num_classes=16,
                                         checkpoint=checkpoint, identity=identity)
    return record, model


def killed_run(monkeypatch, cfg: TrainConfig, path: str, saves: int) -> None:
    """The run of ``run(cfg, path)``, killed right after its ``saves``-th save."""
    with monkeypatch.context() as m:
        kill_after(m, saves)
        with pytest.raises(Killed):
            run(cfg, path)


def assert_same_run(a, b) -> None:
    """The same record (bar its seconds) and bitwise the same weights."""
    (ra, ma), (rb, mb) = a, b
    assert {k: ra[k] for k in SCORED} == {k: rb[k] for k in SCORED}
    sa, sb = ma.state_dict(), mb.state_dict()
    assert sa.keys() == sb.keys() and all(torch.equal(sa[k], sb[k]) for k in sa)


@pytest.mark.parametrize("optimizer, schedule, saves", [("muon", "wsd", 6), ("muon", "wsd", 4), ("adamw", "cosine", 9)])
def test_killed_run_resumes_to_the_uninterrupted_result(tmp_path, monkeypatch, optimizer, schedule, saves):
    """Killed mid-epoch (after step 6 or 9) or at an epoch's end (step 4, the saved order used up),
    the rerun ends with the uninterrupted run's record and weights, and deletes its state."""
    cfg = TrainConfig(epochs=3, batch_size=16, precision="fp32", optimizer=optimizer, schedule=schedule,
                      checkpoint_seconds=0)
    expected = run(cfg)
    path = str(tmp_path / "run.pt")
    killed_run(monkeypatch, cfg, path, saves)
    assert torch.load(path, weights_only=True)["losses"].shape == (saves,)
    resumed = run(cfg, path)
    assert_same_run(resumed, expected)
    assert resumed[0]["steps"] == 12 and not os.listdir(tmp_path)


def test_the_shortened_plan_and_the_seconds_spent_carry_over(tmp_path, monkeypatch):
    """A time budget shortened the run (here fixed to 40 of 48 steps) before the kill: the rerun keeps
    that end and its schedule. The plan's pace marks are seconds since the run began, and the rerun's
    seconds count the earlier piece's."""
    monkeypatch.setattr(training, "_fit_time_budget", lambda plan, seconds_left: plan.update(total=40))
    cfg = TrainConfig(epochs=12, batch_size=16, precision="fp32", max_seconds=1e6, checkpoint_seconds=0)
    expected = run(cfg)
    assert expected[0]["steps"] == 40
    path = str(tmp_path / "run.pt")
    killed_run(monkeypatch, cfg, path, 35)
    state = torch.load(path, weights_only=True)
    assert state["plan"]["total"] == 40 and 0 < state["plan"][10] < state["plan"][30] < state["seconds"]
    torch.save({**state, "seconds": 1000.0}, path)  # as if the first piece had run 1000 s
    resumed = run(cfg, path)
    assert_same_run(resumed, expected)
    assert resumed[0]["seconds"] >= 1000


def test_saves_wait_for_their_interval(tmp_path, monkeypatch):
    """With an interval longer than the run nothing is saved: the clock is read, the device is not."""
    saved = []
    monkeypatch.setattr(training, "_save_run_state", lambda path, state: saved.append(path))
    run(TrainConfig(epochs=2, batch_size=16, precision="fp32", checkpoint_seconds=3600), str(tmp_path / "run.pt"))
    assert saved == []


@pytest.mark.parametrize("first, second", [(True, False), (False, True)])
def test_a_run_resumes_whether_or_not_either_piece_compiled(tmp_path, monkeypatch, first, second):
    """The saved weights carry the eager model's keys (no "_orig_mod."), so a compiled piece resumes an
    eager one and the other way round (config_id leaves compile out)."""
    monkeypatch.setattr(training, "compile_blocks", lambda model: compile_blocks(model, backend="eager"))
    expected = run(TrainConfig(epochs=2, batch_size=16, precision="fp32"))
    path = str(tmp_path / "run.pt")
    cfg = TrainConfig(epochs=2, batch_size=16, precision="fp32", checkpoint_seconds=0, compile=first)
    killed_run(monkeypatch, cfg, path, 5)
    assert not any("_orig_mod" in k for k in torch.load(path, weights_only=True)["model"])
    record, model = run(TrainConfig(epochs=2, batch_size=16, precision="fp32", checkpoint_seconds=0, compile=second),
                        path)
    assert record["steps"] == 8 and record["final_loss"] == pytest.approx(expected[0]["final_loss"], rel=1e-5)
    weights = {k.replace("_orig_mod.", ""): v for k, v in model.state_dict().items()}
    torch.testing.assert_close(weights, expected[1].state_dict(), rtol=1e-5, atol=1e-6)


def test_another_runs_state_is_refused(tmp_path, monkeypatch):
    cfg = TrainConfig(epochs=2, batch_size=16, precision="fp32", checkpoint_seconds=0)
    path = str(tmp_path / "run.pt")
    killed_run(monkeypatch, cfg, path, 2)
    other = {**IDENTITY, "lr": 1e-3, "config_id": "d"}
    with pytest.raises(ValueError, match=rf"{path}: the partial state of another run \(config_id: saved 'c', "
                                         r"this run 'd'; lr: saved 0.005, this run 0.001\)"):
        run(cfg, path, other)
    assert os.path.exists(path)  # kept: it may be the state of a run in another --out


@pytest.mark.parametrize("damage", ["truncated", "empty", "not_a_run_state"])
def test_an_unreadable_state_is_started_over_with_a_warning(tmp_path, monkeypatch, damage):
    """runs.jsonl records what finished; a partial state that cannot be read costs only its steps."""
    cfg = TrainConfig(epochs=2, batch_size=16, precision="fp32", checkpoint_seconds=0)
    expected = run(cfg)
    path = str(tmp_path / "run.pt")
    killed_run(monkeypatch, cfg, path, 3)
    whole = open(path, "rb").read()
    if damage == "not_a_run_state":
        torch.save({"weights": torch.zeros(2)}, path)
    else:
        open(path, "wb").write(whole[: len(whole) // 2] if damage == "truncated" else b"")
    with pytest.warns(UserWarning, match=rf"{path}: unreadable partial run state .*starts from its first step"):
        resumed = run(cfg, path)
    assert_same_run(resumed, expected)
    assert not os.path.exists(path)


def test_a_save_cut_short_keeps_the_previous_state(tmp_path, monkeypatch):
    """The kill lands inside torch.save: the state saved before stays whole, and the rerun resumes
    from it and removes the half-written temporary file."""
    cfg = TrainConfig(epochs=2, batch_size=16, precision="fp32", checkpoint_seconds=0)
    expected = run(cfg)
    path = str(tmp_path / "run.pt")
    killed_run(monkeypatch, cfg, path, 2)
    before = open(path, "rb").read()

    def killed_mid_write(obj, f):
        f.write(b"PK\x03\x04 half a zip")
        raise Killed

    with monkeypatch.context() as m:
        m.setattr(torch, "save", killed_mid_write)
        with pytest.raises(Killed):
            training._save_run_state(path, {"losses": torch.zeros(5)})
    assert open(path, "rb").read() == before and os.path.exists(path + ".tmp")
    assert torch.load(path, weights_only=True)["losses"].shape == (2,)
    # the rest of the run saves nothing: its end deletes the temporary file as well
    assert_same_run(run(dataclasses.replace(cfg, checkpoint_seconds=3600), path), expected)
    assert not os.listdir(tmp_path)


TINY = """
[grid]
tasks = ["in-context-recall"]
mixers = ["attention"]
sweep = "baseline"
[data]
num_train_examples = 32
num_test_examples = 16
[train]
epochs = 2
batch_size = 16
lrs = [5e-3, 1e-3, 5e-4]
weight_decays = [0.1]
precision = "fp32"
checkpoint_seconds = 1e-6  # shorter than any step: a save after every step
[model]
dim = 32
n_heads = 2
hidden_dim = 64
backend = "reference"
"""


def test_grid_resumes_its_partial_runs_first(tmp_path, monkeypatch):
    """Runs of 4 steps, saved every step. A call over lr 5e-4 alone is killed after its run's second
    step; the next call, over the three lrs, logs one partial run, continues it before the two
    unstarted runs (by size alone it would come last), and ends with the records of an uninterrupted
    grid and no partial files."""
    cfg_path = tmp_path / "tiny.toml"
    cfg_path.write_text(TINY)
    cfg = load_config(str(cfg_path))
    expected = {r["lr"]: r for r in runner.run_grid(cfg, cfg.mixers, str(tmp_path / "whole"), log=lambda *_: None)}
    out = tmp_path / "out"
    with monkeypatch.context() as m:
        m.setattr(cfg.train, "lrs", [5e-4])  # the sweep lists are not in the config id
        kill_after(m, 2)
        with pytest.raises(Killed):
            runner.run_grid(cfg, cfg.mixers, str(out), log=lambda *_: None)
    assert not (out / "runs.jsonl").exists()
    label = cfg.settings()[0].label()
    assert os.listdir(out / "partial") == [os.path.basename(runner.partial_path(str(out), label, "attention",
                                                                                5e-4, 0.1))]
    lines = []
    records = runner.run_grid(cfg, cfg.mixers, str(out), log=lines.append)
    assert lines[0] == f"[mad] 0 of 3 runs already in {out / 'runs.jsonl'}; 3 to run, 1 of them from a partial state"
    assert [r["lr"] for r in records] == [5e-4, 5e-3, 1e-3]
    for r in records:
        assert {k: r[k] for k in SCORED} == {k: expected[r["lr"]][k] for k in SCORED}
    assert not os.listdir(out / "partial")


def test_a_failed_job_in_a_worker_fails_the_command_and_the_others_are_kept(tmp_path, monkeypatch, capsys):
    """With --workers a failed job was logged and the command exited 0 (the report short of a run,
    nothing else said). Here the 5e-3 run finds the partial state of the 5e-4 run at its path
    (refused: another run's state); the other two runs finish and are reported, the exit code is 1."""
    cfg_path = tmp_path / "tiny.toml"
    cfg_path.write_text(TINY)
    cfg = load_config(str(cfg_path))
    out = tmp_path / "out"
    with monkeypatch.context() as m:
        m.setattr(cfg.train, "lrs", [5e-4])
        kill_after(m, 2)
        with pytest.raises(Killed):
            runner.run_grid(cfg, cfg.mixers, str(out), log=lambda *_: None)
    label = cfg.settings()[0].label()
    os.replace(runner.partial_path(str(out), label, "attention", 5e-4, 0.1),
               runner.partial_path(str(out), label, "attention", 5e-3, 0.1))
    assert main(["--config", str(cfg_path), "--out", str(out), "--device", "cpu", "--workers", "1"]) == 1
    assert "[mad] 1 of 3 jobs failed (first: ValueError: " in capsys.readouterr().err
    runs = [json.loads(line) for line in (out / "runs.jsonl").read_text().splitlines()]
    assert sorted(r["lr"] for r in runs) == [5e-4, 1e-3]
    assert json.loads((out / "results.json").read_text())["runs_finished"] == 2


def test_partial_file_names_are_readable_and_safe():
    """A label holds "(", "=" and ","; the file name keeps the task, mixer, lr and wd and a hash of the key."""
    path = runner.partial_path("out", SETTING_LABEL, "attention", 5e-4, 0.1)
    name = os.path.basename(path)
    assert os.path.dirname(path) == os.path.join("out", "partial")
    assert name.startswith("ICR_attention_lr0.0005_wd0.1_") and name.endswith(".pt")
    assert set(name) <= set("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_.-")
    others = {runner.partial_path("out", SETTING_LABEL.replace("32", "64"), "attention", 5e-4, 0.1),
              runner.partial_path("out", SETTING_LABEL, "parallax", 5e-4, 0.1),
              runner.partial_path("out", SETTING_LABEL, "attention", 5e-4, 0.0)}
    assert len(others | {path}) == 4


def test_checkpoint_seconds_is_checked_and_leaves_the_config_id(tmp_path):
    """A bad value names the key, the value and what is expected; the option decides how runs execute,
    not what they compute, so the committed grids' config id stays."""
    bad = tmp_path / "bad.toml"
    for value, expected in [("-1", "-1: expected a finite number of seconds >= 0"),
                            ('"60"', "'60': expected float"), ("inf", "inf: expected a finite number")]:
        bad.write_text(f"[train]\ncheckpoint_seconds = {value}\n")
        with pytest.raises(ValueError, match=rf"\[train\] checkpoint_seconds = {expected}"):
            load_config(str(bad))
    with pytest.raises(SystemExit, match="--checkpoint-seconds = -5.0: expected a finite number of seconds >= 0"):
        main(["--config", "configs/mad/cpu_small.toml", "--checkpoint-seconds", "-5", "--out", str(tmp_path / "o")])
    assert not (tmp_path / "o").exists()
    committed = {json.loads(line)["config_id"] for line in open("docs/mad/paper_grid/runs.jsonl")}
    for path in ("configs/mad/paper_baseline.toml", "configs/mad/family.toml"):
        cfg = load_config(path)
        assert {runner.config_id(cfg)} == committed == {"79b72668590c"}
        cfg.train.checkpoint_seconds = 60.0
        assert runner.config_id(cfg) == "79b72668590c"
