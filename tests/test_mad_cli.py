"""`python -m eval.mad` end to end on a tiny grid, and the report/plot from run records."""

import glob
import json
import os

import pytest

from eval.mad.__main__ import main
from eval.mad.grid import load_config, task_settings
from eval.mad.report import best_per_setting, run_key, task_scores, write_report

TINY = """
[grid]
tasks = ["in-context-recall", "memorization"]
sweep = "baseline"
[data]
num_train_examples = 32
num_test_examples = 16
[train]
epochs = 1
batch_size = 16
lrs = [5e-3, 1e-3]
weight_decays = [0.1]
precision = "fp32"
[model]
dim = 32
n_heads = 2
hidden_dim = 64
backend = "reference"
"""


def test_cli_tiny_grid(tmp_path):
    cfg = tmp_path / "tiny.toml"
    cfg.write_text(TINY)
    out = tmp_path / "out"
    assert main(["--config", str(cfg), "--mixers", "attention,parallax", "--out", str(out), "--device", "cpu"]) == 0
    runs = [json.loads(line) for line in (out / "runs.jsonl").read_text().splitlines()]
    assert len(runs) == 2 * 2 * 2  # settings x mixers x lrs
    assert all(0 <= r["test_acc_micro"] <= 1 and 0 <= r["test_acc_macro_all"] <= 1 for r in runs)
    summary = json.loads((out / "results.json").read_text())
    assert set(summary["scores"]) == {"attention", "parallax"}
    assert summary["scores"]["parallax"]["avg"]["n"] == 2
    assert (summary["runs_finished"], summary["runs_planned"]) == (8, 8)
    table = (out / "table.md").read_text()
    assert "| ICR |" in table and "| MEM |" in table and "Runs finished: 8 of 8 planned (attention, parallax)." in table
    # one baseline setting per task against the paper's means over 11 / 6 settings: not comparable
    assert "0.716" not in table and "0.951" not in table and "n/a" in table


def fake_runs(calls):
    """A stand-in for runner.run_job that records its calls and returns a record at once."""
    from eval.mad import runner

    def run_job(setting, mixer, lr, wd, cfg, device, checkpoint=None):
        calls.append((setting.label(), mixer, lr, wd))
        return [{"task": setting.task, "setting": setting.label(), "params": {}, "mixer": mixer, "lr": lr,
                 "weight_decay": wd, "config_id": runner.config_id(cfg), "test_acc": 0.5, "test_acc_micro": 0.6,
                 "final_loss": 1.0, "seconds": 0.0}]
    return run_job


@pytest.mark.parametrize("out, message", [
    ("", r"--out: got '', which names no folder; expected a folder \(made when missing\)"),
    ("  ", r"--out: got '', which names no folder; expected a folder \(made when missing\)"),
    ("notes", r"--out: '.*notes' is a file; expected a folder \(made when missing\)"),
    ("notes/out", r"--out: cannot create or write '.*notes/out' \('.*notes' is not a writable folder\); "
                  r"expected a folder \(made when missing\)"),
], ids=["empty", "blank", "file", "under_a_file"])
def test_a_bad_output_folder_is_refused_before_any_run(tmp_path, monkeypatch, out, message):
    """An empty --out (an unset shell variable: runs.jsonl and the tables in the working directory), a
    file, or a folder that cannot be made (under a file: refused for root too) stops the command by
    name before the first run, and nothing is written."""
    from eval.mad import runner

    calls = []
    monkeypatch.setattr(runner, "run_job", fake_runs(calls))
    monkeypatch.chdir(tmp_path)
    (tmp_path / "tiny.toml").write_text(TINY)
    (tmp_path / "notes").write_text("notes")
    out = str(tmp_path / out) if out.strip() else out
    for mode in ([], ["--report-only"]):
        with pytest.raises(SystemExit, match=f"^{message}"):
            main(["--config", "tiny.toml", "--mixers", "attention", "--out", out, *mode])
    assert not calls and sorted(os.listdir(tmp_path)) == ["notes", "tiny.toml"]
    assert (tmp_path / "notes").read_text() == "notes"


def test_runner_resumes_and_skips_finished_runs(tmp_path, monkeypatch):
    from eval.mad import runner

    cfg_path = tmp_path / "tiny.toml"
    cfg_path.write_text(TINY.replace("weight_decays = [0.1]", "weight_decays = [0.0, 0.1]"))
    cfg = load_config(str(cfg_path))
    calls = []
    monkeypatch.setattr(runner, "run_job", fake_runs(calls))
    out = tmp_path / "out"
    assert len(runner.run_grid(cfg, ["attention", "parallax"], str(out), log=lambda *_: None)) == 16
    assert len(set(calls)) == 16  # 2 settings x 2 mixers x 2 lrs x 2 wds
    lines = (out / "runs.jsonl").read_text().splitlines()
    # killed mid-run: the last record half written, two more never started
    (out / "runs.jsonl").write_text("\n".join(lines[:13]) + "\n" + lines[13][:20])
    calls.clear()
    assert len(runner.run_grid(cfg, ["attention", "parallax"], str(out), log=lambda *_: None)) == 3
    assert sorted(calls) == sorted(tuple(json.loads(l)[k] for k in ("setting", "mixer", "lr", "weight_decay"))
                                   for l in lines[13:])
    records = [json.loads(l) for l in (out / "runs.jsonl").read_text().splitlines()]
    assert len(records) == 16 and len({runner.run_key(r) for r in records}) == 16
    calls.clear()
    assert runner.run_grid(cfg, ["attention", "parallax"], str(out), log=lambda *_: None) == [] and not calls
    cfg.train.epochs = 2  # another config: refused, not mixed in
    with pytest.raises(ValueError, match="runs of other configs"):
        runner.run_grid(cfg, ["attention"], str(out), log=lambda *_: None)


def test_report_shows_the_paper_only_for_the_same_settings(tmp_path):
    runs = []
    for task in ("in-context-recall", "memorization"):
        sweep = "mad" if task == "memorization" else "baseline"
        for s in task_settings(task, sweep):
            for wd, acc in ((0.0, 0.7), (0.1, 0.9)):
                runs.append({"task": task, "setting": s.label(), "params": {}, "mixer": "parallax", "lr": 1e-3,
                             "weight_decay": wd, "test_acc": acc, "test_acc_micro": acc - 0.05})
    planned = {run_key(r) for r in runs} | {("ICR(unfinished)", "parallax", 1e-3, wd) for wd in range(4)}
    scores = write_report(runs, str(tmp_path), "t", planned=planned)
    assert scores["parallax"]["MEM"] == (pytest.approx(0.9), 6)  # best over wd, mean over MAD's 6 settings
    rows = {line.split("|")[1].strip(): [c.strip() for c in line.split("|")[2:-1]]
            for line in (tmp_path / "table.md").read_text().splitlines() if line.startswith("| ") and "(n=" in line}
    assert rows["MEM"] == ["0.900 (n=6)", "0.850", "0.733"]  # all 6 settings: the paper's mean beside ours
    assert rows["ICR"] == ["0.900 (n=1)", "0.850", "n/a"]  # 1 of 11 settings: not comparable
    assert rows["avg"][2] == "n/a"
    assert f"Runs finished: {len(runs)} of {len(runs) + 4} planned." in (tmp_path / "table.md").read_text()


def test_report_best_and_mean(tmp_path):
    runs = []
    for mixer, accs in {"attention": [0.2, 0.6], "parallax": [0.9, 0.1]}.items():
        for s, task in zip(task_settings("in-context-recall", "hard")[:2], ["in-context-recall"] * 2):
            for lr, acc in zip([1e-3, 5e-3], accs):
                runs.append({"task": task, "setting": s.label(), "params": s.__dict__, "mixer": mixer, "lr": lr,
                             "weight_decay": 0.1, "test_acc": acc if s.seq_len == 256 else acc / 2})
    best = best_per_setting(runs)
    assert best[("attention", "in-context-recall", task_settings("in-context-recall", "hard")[0].label())]["lr"] == 5e-3
    scores = task_scores(best)
    assert scores["attention"]["ICR"] == (pytest.approx((0.6 + 0.3) / 2), 2)
    write_report(runs, str(tmp_path), "t", config={"sweep": "hard"})
    assert os.path.getsize(tmp_path / "hard_sweep.png") > 10_000


def test_config_repeats_are_planned_once_as_on_the_command_line(tmp_path):
    """Repeated lrs, weight_decays and mixers in a TOML are kept once, as --lrs, --wds and --mixers
    keep them: the report's planned count is lrs x wds x mixers x settings of distinct runs."""
    from eval.mad import __main__ as mad_cli

    cfg_path = tmp_path / "repeats.toml"
    cfg_path.write_text(TINY.replace("lrs = [5e-3, 1e-3]", "lrs = [5e-3, 1e-3, 0.005, 1e-3]")
                        .replace("weight_decays = [0.1]", "weight_decays = [0.1, 0.0, 0.1]")
                        .replace('sweep = "baseline"', 'sweep = "baseline"\nmixers = ["parallax", "attention", "parallax"]'))
    cfg = load_config(str(cfg_path))
    assert (cfg.train.lrs, cfg.train.weight_decays, cfg.mixers) == ([5e-3, 1e-3], [0.1, 0.0], ["parallax", "attention"])
    args = mad_cli._parser().parse_args(["--config", str(cfg_path), "--out", "o", "--lrs", "5e-3,1e-3,0.005,1e-3",
                                         "--wds", "0.1,0.0,0.1", "--mixers", "parallax,attention,parallax"])
    cli = mad_cli._apply_overrides(load_config(str(cfg_path)), args)
    assert (cli.train.lrs, cli.train.weight_decays, cli.mixers) == (cfg.train.lrs, cfg.train.weight_decays, cfg.mixers)


def test_config_errors(tmp_path):
    bad = tmp_path / "bad.toml"
    bad.write_text("[train]\nepoch = 3\n")
    with pytest.raises(ValueError, match="epoch"):
        load_config(str(bad))
    bad.write_text('[train]\nlrs = "5e-3"\n')
    with pytest.raises(ValueError, match=r"\[train\] lrs = '5e-3': expected a list of float"):
        load_config(str(bad))
    bad.write_text('[data]\nnum_train = 5\n')
    with pytest.raises(ValueError, match="num_train"):
        load_config(str(bad))
    paper = load_config("configs/mad/paper_baseline.toml")
    assert paper.train.lrs == [5e-3, 1e-3, 5e-4] and paper.train.weight_decays == [0.0, 0.1]  # mad-lab's wds
    assert paper.train.precision == "bf16" and paper.selective_copy == "mad_lab_cached"
    assert len(load_config("configs/mad/paper_baseline.toml").settings()) == 66
    assert len(load_config("configs/mad/paper_hard.toml").settings()) == 12


def test_mixers_come_from_the_toml_unless_the_cli_names_them(tmp_path, monkeypatch):
    """[grid] mixers picks the mixers (the paper config lists its five); --mixers overrides it; an
    unknown name, or an fla mixer without flash-linear-attention, stops before any run, naming the key."""
    import importlib.util
    import sys

    paper = load_config("configs/mad/paper_baseline.toml")
    assert paper.mixers == ["attention", "parallax", "gated_deltanet", "mamba2", "mesa_net"]
    cfg = tmp_path / "tiny.toml"
    cfg.write_text(TINY.replace("[grid]\n", '[grid]\nmixers = ["parallax"]\n'))
    out = tmp_path / "out"
    assert main(["--config", str(cfg), "--out", str(out), "--device", "cpu"]) == 0
    runs = [json.loads(line) for line in (out / "runs.jsonl").read_text().splitlines()]
    assert {r["mixer"] for r in runs} == {"parallax"}
    bad = tmp_path / "bad.toml"
    bad.write_text(TINY.replace("[grid]\n", '[grid]\nmixers = ["lstm"]\n'))
    with pytest.raises(SystemExit, match=r"\[grid\] mixers = \['lstm'\]: unknown \['lstm'\]"):
        main(["--config", str(bad), "--out", str(tmp_path / "o2"), "--device", "cpu"])
    with pytest.raises(SystemExit, match="--mixers = \\['attention', 'gru'\\]"):
        main(["--config", str(cfg), "--mixers", "attention,gru", "--out", str(tmp_path / "o3"), "--device", "cpu"])
    if importlib.util.find_spec("fla") is not None:  # installed (scripts/test.sh): a CPU run is refused up front
        with pytest.raises(SystemExit, match=r"mixers \['mamba2'\] run fla's Triton kernels, which need CUDA"):
            main(["--config", str(cfg), "--mixers", "mamba2", "--out", str(tmp_path / "o5"), "--device", "cpu"])
    monkeypatch.setitem(sys.modules, "fla.layers", None)  # flash-linear-attention not importable
    fla = tmp_path / "fla.toml"
    fla.write_text(TINY.replace("[grid]\n", '[grid]\nmixers = ["attention", "mamba2"]\n'))
    with pytest.raises(SystemExit, match=r"\[grid\] mixers = \['attention', 'mamba2'\]: \['mamba2'\] need flash-linear"):
        main(["--config", str(fla), "--out", str(tmp_path / "o4"), "--device", "cpu"])
    assert load_config(str(fla)).mixers == ["attention", "mamba2"]  # --mixers may still replace them
    assert not any((tmp_path / d).exists() for d in ("o2", "o3", "o4", "o5"))


def test_only_settings_keeps_the_settings_whose_label_has_a_fragment():
    """ICR's MAD sweep: the baseline (seq_len 128) and its changes; "seq_len=512" keeps exactly the
    settings with that length, two fragments keep either, and a fragment that matches nothing is an
    error naming it and listing the grid's settings, before any run."""
    cfg = load_config("configs/mad/paper_baseline.toml")
    cfg.tasks = ["in-context-recall"]
    every = cfg.settings()
    cfg.only_settings = ["seq_len=512"]
    kept = cfg.settings()
    assert kept and all(s.seq_len == 512 for s in kept)
    assert len(kept) == sum(s.seq_len == 512 for s in every)
    cfg.only_settings = ["seq_len=512", "vocab_size=64"]
    assert {s.label() for s in cfg.settings()} == {s.label() for s in every
                                                   if s.seq_len == 512 or s.vocab_size == 64}
    cfg.only_settings = ["seq_len=999"]
    with pytest.raises(ValueError, match=r"\['seq_len=999'\] match no setting of the grid; its settings are"):
        cfg.settings()


def test_cli_settings_option_is_checked_before_any_run(tmp_path, capsys):
    from eval.mad.__main__ import main

    with pytest.raises(SystemExit, match="seq_len=999"):
        main(["--config", "configs/mad/paper_baseline.toml", "--tasks", "ICR", "--mixers", "attention",
              "--settings", "seq_len=999", "--out", str(tmp_path / "out"), "--device", "cpu"])
    assert not (tmp_path / "out" / "runs.jsonl").exists()


def test_settings_fragments_keep_a_whole_label_in_one_piece():
    """A label has commas inside its parentheses: given whole, it selects that one setting (split at
    every comma, its pieces matched eleven more ICR settings)."""
    from eval.mad.__main__ import split_fragments

    assert split_fragments("seq_len=512, vocab_size=64,") == ["seq_len=512", "vocab_size=64"]
    assert split_fragments("ICR(vocab_size=16,seq_len=128),seq_len=512") == ["ICR(vocab_size=16,seq_len=128)",
                                                                             "seq_len=512"]
    cfg = load_config("configs/mad/paper_baseline.toml")
    cfg.tasks = ["in-context-recall"]
    baseline = cfg.settings()[0].label()
    cfg.only_settings = split_fragments(baseline)
    assert [s.label() for s in cfg.settings()] == [baseline]


def test_compile_is_how_a_run_executes_not_which_run_it_is():
    """Compiled runs count in a grid of eager ones (and the other way round); a train setting
    that changes what a run computes changes the id."""
    from eval.mad.runner import config_id

    cfg = load_config("configs/mad/paper_baseline.toml")
    eager = config_id(cfg)
    cfg.train.compile = True
    assert config_id(cfg) == eager
    cfg.train.epochs += 1
    assert config_id(cfg) != eager


@pytest.mark.parametrize("task, mixer", [("in-context-recall", "attention"), ("in-context-recall", "parallax"),
                                         ("compression", "attention")])
def test_compiled_blocks_give_the_eager_model(task, mixer):
    import torch

    from eval.mad.models import build_model, compile_blocks

    model = build_model(task, mixer, 16, 32, dim=32, n_heads=4, hidden_dim=64)
    tokens = torch.randint(0, 16, (2, 32), generator=torch.Generator().manual_seed(0))
    expected = model(tokens)
    compile_blocks(model, backend="aot_eager")
    lm = getattr(model, "lm", model)
    assert all(isinstance(b, torch._dynamo.eval_frame.OptimizedModule) for b in lm.layers.values())
    torch.testing.assert_close(model(tokens), expected, rtol=1e-6, atol=1e-6)


def test_train_config_compile_compiles_before_training(monkeypatch):
    """[train] compile = true (or --compile) compiles the blocks before the first step; the losses
    equal the eager run's."""
    import torch

    from eval.mad import training
    from eval.mad.grid import TrainConfig
    from eval.mad.models import build_model, compile_blocks
    from eval.mad.tasks import TaskSetting, make_dataset

    setting = TaskSetting("in-context-recall", 16, 32, num_train_examples=64, num_test_examples=32, seed=1)
    data = make_dataset(setting)
    seen = []
    monkeypatch.setattr(training, "compile_blocks", lambda m: seen.append(m) or compile_blocks(m, "aot_eager"))
    results = []
    for compiled in (False, True):
        model = build_model(setting.task, "attention", 16, 32, dim=32, n_heads=4, hidden_dim=64)
        cfg = TrainConfig(epochs=2, batch_size=16, precision="fp32", compile=compiled)
        results.append(training.train_and_evaluate(model, data, cfg, lr=5e-3, weight_decay=0.0, num_classes=16))
    assert len(seen) == 1
    assert results[1]["final_loss"] == pytest.approx(results[0]["final_loss"], rel=1e-5)
    assert torch.isfinite(torch.tensor(results[1]["final_loss"]))


def test_compile_blocks_survives_more_models_than_the_recompile_limit():
    """A worker process trains many MAD models; their blocks share one code object, so without a
    reset the ninth compile in a process would hit dynamo's recompile limit (8) and, under
    fullgraph, fail the run."""
    import torch

    from eval.mad.models import build_model, compile_blocks

    on_cpu = ["attention", "parallax", "parallax_norope", "exact_lla", "value_averaging", "affine_la", "affine_mesanet"]
    for mixer, heads in [(m, h) for h in (2, 4) for m in on_cpu]:  # 14 kinds of block: above the limit
        model = build_model("in-context-recall", mixer, 16, 8, dim=32, n_heads=heads, hidden_dim=32)
        compile_blocks(model, backend="eager")
        assert torch.isfinite(model(torch.zeros(1, 8, dtype=torch.long))).all()


def test_runs_line_counts_the_planned_mixers_apart_from_the_others():
    from eval.mad.report import runs_line

    def run(mixer, lr):
        return {"setting": "ICR(vocab_size=16,seq_len=128)", "mixer": mixer, "lr": lr, "weight_decay": 0.0}

    runs = ([run("attention", lr) for lr in range(12)] + [run("affine_la", lr) for lr in range(5)]
            + [run("value_averaging", lr) for lr in range(6)])
    planned = {("ICR(vocab_size=16,seq_len=128)", m, float(lr), 0.0) for m in ("affine_la", "value_averaging")
               for lr in range(6)}
    assert runs_line(runs, planned, ["affine_la", "value_averaging"]) == (
        "Runs finished: 11 of 12 planned (affine_la, value_averaging); the table also reads 12 runs outside this "
        "grid (other mixers, settings, learning rates or weight decays) from the same folder.")
    everything = {("ICR(vocab_size=16,seq_len=128)", m, float(lr), 0.0)
                  for m in ("attention", "affine_la", "value_averaging") for lr in range(12)}
    assert runs_line(runs, everything) == "Runs finished: 23 of 36 planned."
    assert runs_line(runs) == "Runs finished: 23."


def test_report_only_without_a_finished_run_says_so(tmp_path, capsys):
    """A call cut short before any run finished leaves no runs.jsonl (only partial states): the
    report step says there is nothing to report instead of failing."""
    assert main(["--config", "configs/mad/cpu_small.toml", "--out", str(tmp_path), "--report-only"]) == 0
    assert "no finished run" in capsys.readouterr().out
    assert not (tmp_path / "table.md").exists()


ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
COMMITTED = sorted(os.path.basename(os.path.dirname(p)) for p in glob.glob(f"{ROOT}/docs/mad/*/runs.jsonl"))


@pytest.mark.parametrize("name", COMMITTED)
def test_committed_results_are_rebuilt_by_the_command_they_record(name):
    """Each results folder under docs/mad/: its results.json records the command that wrote it; that
    command rebuilds this folder under a config its page names, the runs carry that config's id (so
    --report-only accepts them instead of refusing them as another config's), and results.json
    holds the runs and the scores they give."""
    from eval.mad.__main__ import _apply_overrides, _parser
    from eval.mad.grid import check_config_id
    from eval.mad.report import load_runs

    folder = os.path.join(ROOT, "docs", "mad", name)
    with open(os.path.join(folder, "results.json")) as f:
        results = json.load(f)
    args = _parser().parse_args(results["config"]["argv"])
    assert os.path.normpath(args.out) == os.path.join("docs", "mad", name)  # paths from the repository root
    with open(os.path.join(folder, "table.md")) as f:
        assert args.config in f.read()
    runs_path = os.path.join(folder, "runs.jsonl")
    runs = load_runs(runs_path)
    check_config_id(runs, _apply_overrides(load_config(os.path.join(ROOT, args.config)), args), runs_path)
    assert results["runs"] == runs
    scores = task_scores(best_per_setting(runs))
    assert {m: {t: (s["mean"], s["n"]) for t, s in ts.items()} for m, ts in results["scores"].items()} == scores
