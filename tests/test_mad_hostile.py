"""Bad input to the MAD benchmark: refused by name before any run, and nothing written is lost."""

import json
import math
import os
import re

import pytest

from eval.mad import bundle
from eval.mad.__main__ import main
from eval.mad.grid import load_config, task_settings
from eval.mad.runner import PARTIAL
from eval.mad.tasks import TaskSetting
from tests.test_mad_cli import TINY, fake_runs


def _config(tmp_path, text=TINY, name="c.toml"):
    path = tmp_path / name
    path.write_text(text)
    return str(path)


@pytest.mark.parametrize("task, values, message", [
    ("in-context-recall", dict(noise_vocab_size=-2), r"noise_vocab_size=-2; expected >= 0"),
    ("in-context-recall", dict(vocab_size=16.5), r"vocab_size=16.5; expected int"),
    ("noisy-in-context-recall", dict(vocab_size=32, noise_vocab_size=16, frac_noise=math.nan),
     r"frac_noise=nan; expected a finite number"),
    ("memorization", dict(vocab_size=2, seq_len=4), r"vocab_size=2; expected >= 3"),
    ("fuzzy-in-context-recall", dict(k_motif_size=0), r"k_motif_size=0; expected >= 1"),
    ("compression", dict(seq_len=1), r"seq_len=1; expected >= 2"),
    ("compression", dict(num_train_examples=0), r"num_train_examples=0; expected >= 1"),
    ("compression", dict(seed=-1), r"seed=-1; expected >= 0"),
    ("compression", dict(k_motif_size=3), r"k_motif_size=3; expected the default 1: compression does not read it"),
])
def test_a_setting_that_no_generator_can_make_is_refused_when_made(task, values, message):
    """Each value is checked as the setting is made (a grid makes its settings before any run),
    with the setting, the field, the value and what was expected; before, these failed in the
    first run (numpy's "low >= high", a TypeError) or made data that differs from the label."""
    params = {"vocab_size": 16, "seq_len": 128, **values}
    with pytest.raises(ValueError, match=message):
        TaskSetting(task, **params)


def test_a_bad_data_value_stops_the_command_before_any_run(tmp_path):
    config = _config(tmp_path, TINY.replace("num_test_examples = 16", "num_test_examples = 16\nnoise_vocab_size = -2"))
    with pytest.raises(SystemExit, match=r"ICR\(.*noise_vocab_size=-2\): noise_vocab_size=-2; expected >= 0"):
        main(["--config", config, "--mixers", "attention", "--out", str(tmp_path / "out"), "--device", "cpu"])
    assert not (tmp_path / "out").exists()


def test_a_data_key_sets_the_tasks_that_read_it(tmp_path):
    """[data] k_motif_size is fuzzy recall's: it no longer labels ICR and MEM settings whose data do
    not have it; a key that no task of the grid reads is refused."""
    config = _config(tmp_path, TINY.replace('tasks = ["in-context-recall", "memorization"]',
                                            'tasks = ["in-context-recall", "fuzzy-in-context-recall", "memorization"]')
                     .replace("num_test_examples = 16", "num_test_examples = 16\nk_motif_size = 2"))
    settings = load_config(config).settings()
    assert {s.task: s.k_motif_size for s in settings} == {"in-context-recall": 1, "fuzzy-in-context-recall": 2,
                                                         "memorization": 1}
    assert [s.label() for s in settings if "k_motif_size" in s.label()] == [
        "FCR(vocab_size=16,seq_len=128,num_train_examples=32,k_motif_size=2,v_motif_size=3)"]
    cfg = load_config(_config(tmp_path, TINY.replace("num_test_examples = 16", "num_test_examples = 16\n"
                                                     "num_tokens_to_copy = 8"), "sc.toml"))
    with pytest.raises(ValueError, match=r"\[data\] num_tokens_to_copy = 8: no task of the grid .* reads it"):
        cfg.settings()
    with pytest.raises(ValueError, match=r"overrides \['foo'\]"):  # filtered by task, yet no name is lost
        task_settings("compression", "mad", foo=1)


def test_a_task_without_settings_in_the_sweep_is_refused(tmp_path):
    """The harder sweep has no compression setting: asking for it ran nothing and exited 0."""
    with pytest.raises(SystemExit, match=r"\['compression'\] have no setting in the 'hard' sweep"):
        main(["--config", _config(tmp_path), "--tasks", "CMP", "--sweep", "hard", "--mixers", "attention",
              "--out", str(tmp_path / "out"), "--device", "cpu"])
    cfg = load_config(_config(tmp_path))
    cfg.tasks = []  # [grid] tasks = []: no run, exit 0
    with pytest.raises(ValueError, match=r"tasks = \[\]: expected 'all' or a non-empty list"):
        cfg.settings()
    cfg.tasks, cfg.sweep = ["compression", "in-context-recall", "fuzzy-in-context-recall",
                            "noisy-in-context-recall", "memorization", "selective-copying"], "hard"
    assert len(cfg.settings()) == 12  # all six tasks: the sweep's own


@pytest.mark.parametrize("heads", [3, 32])
def test_heads_must_split_the_width_into_even_heads(tmp_path, heads):
    """n_heads 3 does not divide 32; 32 heads of 1 column cannot take RoPE: both failed in the first run."""
    with pytest.raises(ValueError, match=rf"\[model\] n_heads = {heads}: expected a divisor of dim = 32"):
        load_config(_config(tmp_path, TINY.replace("n_heads = 2", f"n_heads = {heads}")))


@pytest.mark.parametrize("option, value, message", [
    ("--backend", "foo", None),  # ran attention, which ignores it, as if it had been given
    ("--device", "foo", r"--device: got 'foo'; expected 'cpu', 'cuda' or 'cuda:N'"),
    ("--device", "cuda:7", r"--device: got 'cuda:7', but this machine has \d+ CUDA device"),
    ("--settings", ",", r"--settings = ',': expected label fragments"),
])
def test_bad_options_stop_before_any_run(tmp_path, monkeypatch, option, value, message):
    from eval.mad import runner

    calls = []
    monkeypatch.setattr(runner, "run_job", fake_runs(calls))
    with pytest.raises(SystemExit, match=message):
        main(["--config", _config(tmp_path), "--mixers", "attention", "--out", str(tmp_path / "out"),
              "--device", "cpu", option, value])
    assert not calls and not (tmp_path / "out" / "runs.jsonl").exists()


@pytest.mark.parametrize("option", ["--tasks", "--mixers", "--settings"])
def test_an_empty_selection_is_refused_not_read_as_the_configs(tmp_path, monkeypatch, option):
    """--tasks "" (an unset shell variable) ran the config's tasks without a word."""
    from eval.mad import runner

    calls = []
    monkeypatch.setattr(runner, "run_job", fake_runs(calls))
    with pytest.raises(SystemExit, match=f"^{option}\\b"):
        main(["--config", _config(tmp_path), "--out", str(tmp_path / "out"), "--device", "cpu", option, ""])
    assert not calls and not (tmp_path / "out").exists()


@pytest.mark.parametrize("config, message", [
    ("missing", "cannot be read (No such file or directory)"), ("folder", "cannot be read (Is a directory)"),
    ("not_toml", "not valid TOML"),
])
def test_a_config_that_cannot_be_read_is_named(tmp_path, config, message):
    """A missing or folder --config was a traceback; a file that is not TOML an error without its name."""
    path = tmp_path / "c.toml"
    if config == "folder":
        path.mkdir()
    elif config == "not_toml":
        path.write_text("[grid\nmixers = 1\n")
    with pytest.raises(SystemExit, match=f"--config = {str(path)!r}: {re.escape(message)}"):
        main(["--config", str(path), "--out", str(tmp_path / "out"), "--report-only"])


def _grid(tmp_path, monkeypatch, config):
    from eval.mad import runner

    monkeypatch.setattr(runner, "run_job", fake_runs([]))
    out = tmp_path / "out"
    assert main(["--config", config, "--mixers", "attention", "--out", str(out), "--device", "cpu"]) == 0
    return out


@pytest.mark.parametrize("report_only", [False, True])
def test_a_damaged_runs_file_is_named_and_kept(tmp_path, monkeypatch, report_only):
    """A line in the middle that is not a run record stops the command with the file and line,
    instead of a JSONDecodeError traceback; the file is left as it was."""
    config = _config(tmp_path)
    out = _grid(tmp_path, monkeypatch, config)
    lines = (out / "runs.jsonl").read_text().splitlines()
    damaged = "\n".join([lines[0], '{"task": "in-context-re', *lines[1:]]) + "\n"
    (out / "runs.jsonl").write_text(damaged)
    with pytest.raises(SystemExit, match=r"runs.jsonl: line 2 = .*: expected a run record"):
        main(["--config", config, "--mixers", "attention", "--out", str(out)]
             + (["--report-only"] if report_only else ["--device", "cpu"]))
    assert (out / "runs.jsonl").read_text() == damaged


@pytest.mark.parametrize("option", [["--device", "cpu"], ["--workers", "2"], ["--threads", "4"], ["--deadline", "60"],
                                    ["--compile"], ["--checkpoint-seconds", "5"]])
def test_report_only_refuses_the_options_of_the_runs(tmp_path, option):
    """--report-only runs nothing: a run option given with it would be ignored without a word (--compile
    and --checkpoint-seconds would even stand in results.json's config as the runs' settings)."""
    with pytest.raises(SystemExit, match=rf"{option[0]}: options of the runs, and --report-only runs nothing"):
        main(["--config", _config(tmp_path), "--out", str(tmp_path / "out"), "--report-only", *option])


def test_report_only_refuses_the_runs_of_another_config(tmp_path, monkeypatch):
    """Rebuilding the tables under another config (here --epochs 5) would score the folder's runs
    under a config they did not run with."""
    config = _config(tmp_path)
    out = _grid(tmp_path, monkeypatch, config)
    table = (out / "table.md").read_text()
    with pytest.raises(SystemExit, match="runs of other configs"):
        main(["--config", config, "--out", str(out), "--report-only", "--epochs", "5"])
    assert (out / "table.md").read_text() == table


def test_a_second_pack_keeps_every_state(tmp_path):
    """Packing twice deleted the first pack's tars and found no state left to pack: every state lost."""
    folder = tmp_path / PARTIAL
    folder.mkdir()
    (folder / "a.pt").write_bytes(b"state a")
    bundle.pack(str(tmp_path), max_bytes=100)
    (folder).mkdir()
    (folder / "b.pt").write_bytes(b"state b")  # a run saved after the first pack
    bundle.pack(str(tmp_path), max_bytes=100)
    bundle.pack(str(tmp_path), max_bytes=100)
    bundle.unpack(str(tmp_path))
    assert {p.name: p.read_bytes() for p in folder.iterdir()} == {"a.pt": b"state a", "b.pt": b"state b"}


def test_pack_refuses_a_file_that_is_not_a_tar_of_states(tmp_path):
    (tmp_path / "partial_1.tar").write_bytes(b"half copied")
    with pytest.raises(ValueError, match="partial_1.tar is not a tar of states"):
        bundle.pack(str(tmp_path), max_bytes=100)
    assert (tmp_path / "partial_1.tar").read_bytes() == b"half copied"


def test_bundle_command_names_a_damaged_tar(tmp_path, capsys):
    """The damaged tar stopped the command with a traceback."""
    (tmp_path / "partial_1.tar").write_bytes(b"half copied")
    with pytest.raises(SystemExit) as info:
        bundle.main(["unpack", str(tmp_path)])
    assert info.value.code == 2 and "partial_1.tar is not a tar of states" in capsys.readouterr().err
    assert (tmp_path / "partial_1.tar").read_bytes() == b"half copied"


@pytest.mark.parametrize("action", ["pack", "unpack"])
@pytest.mark.parametrize("layout", ["missing", "file"])
def test_bundle_folder_that_is_not_one_is_refused(tmp_path, capsys, action, layout):
    """A mistyped grid folder packed nothing (exit 0), unpack made a stray partial/ under it, and a file
    there was a NotADirectoryError traceback."""
    out = tmp_path / "grid"
    if layout == "file":
        out.write_text("notes")
    with pytest.raises(SystemExit) as info:
        bundle.main([action, str(out)])
    assert info.value.code == 2 and f"out_dir = {str(out)!r}: not a folder" in capsys.readouterr().err
    assert os.listdir(tmp_path) == ([] if layout == "missing" else ["grid"])


@pytest.mark.parametrize("size", ["0", "nan", "-1"])
def test_bundle_size_option_is_checked(tmp_path, capsys, size):
    with pytest.raises(SystemExit):
        bundle.main(["pack", str(tmp_path), "--max-mib", size])
    assert f"--max-mib = {float(size)}: expected a finite size > 0" in capsys.readouterr().err
    assert os.listdir(tmp_path) == []


def test_runs_file_line_is_a_record(tmp_path):
    """A JSON line that is not a run record (no setting, an unknown task) is refused by name too."""
    from eval.mad.report import load_runs

    record = {"task": "in-context-recall", "setting": "s", "mixer": "attention", "lr": 1e-3, "weight_decay": 0.0,
              "test_acc": 0.5}
    path = tmp_path / "runs.jsonl"
    for bad in ([1, 2], {**record, "task": "recall"}, {k: v for k, v in record.items() if k != "setting"}):
        path.write_text(json.dumps(record) + "\n" + json.dumps(bad) + "\n")
        with pytest.raises(ValueError, match=r"line 2 = .*: expected a run record"):
            load_runs(str(path))


def test_an_int_for_a_float_key_is_the_same_config(tmp_path):
    """TOML's `grad_clip = 1` and `grad_clip = 1.0` are one setting; the config id hashed them apart,
    so a rerun of the same grid with either spelling refused the other's runs."""
    from eval.mad.grid import config_id

    one = load_config(_config(tmp_path, TINY.replace("precision", "grad_clip = 1\nmin_lr = 0\nprecision"), "a.toml"))
    other = load_config(_config(tmp_path, TINY.replace("precision", "grad_clip = 1.0\nmin_lr = 0.0\nprecision"),
                                "b.toml"))
    assert config_id(one) == config_id(other)


@pytest.mark.parametrize("narrower", [["--tasks", "ICR"], ["--lrs", "5e-3"], ["--settings", "MEM"]])
def test_runs_outside_the_grid_are_not_counted_as_its_finished_runs(tmp_path, monkeypatch, narrower):
    """A folder filled by a wider grid (other tasks, settings or learning rates of the same config id)
    and reported for a narrower one said "Runs finished: 4 of 2 planned": every run of the planned
    mixers counted as one of the grid's."""
    config = _config(tmp_path)
    out = _grid(tmp_path, monkeypatch, config)  # ICR and MEM x lrs 5e-3, 1e-3: 4 runs of attention
    assert main(["--config", config, "--mixers", "attention", "--out", str(out), "--report-only", *narrower]) == 0
    table = (out / "table.md").read_text()
    assert ("Runs finished: 2 of 2 planned (attention); the table also reads 2 runs outside this grid (other "
            "mixers, settings, learning rates or weight decays) from the same folder.") in table
    summary = json.loads((out / "results.json").read_text())
    assert (summary["runs_finished"], summary["runs_planned"], summary["runs_read"]) == (2, 2, 4)


@pytest.mark.parametrize("line, message", [
    ('tasks = ["ICR"]', r"c.toml: \[grid\] tasks = \['ICR'\]: unknown \['ICR'\]; expected 'all' or a list from "),
    ('only_settings = ["ICR", " "]', r"c.toml: \[grid\] only_settings = \['ICR', ' '\]: an empty fragment is part "
                                     r"of every label \(it would keep every setting\); expected label fragments"),
])
def test_a_grid_key_that_selects_nothing_or_everything_is_named(tmp_path, line, message):
    """A short task name in the TOML (the command line takes them) failed with "task='ICR'", naming
    neither the file nor the key; an empty only_settings fragment, which the command line refuses,
    kept every setting of the grid."""
    config = _config(tmp_path, TINY.replace("[grid]\n", f"[grid]\n{line}\n", 1).replace(
        'tasks = ["in-context-recall", "memorization"]\n', "" if line.startswith("tasks") else
        'tasks = ["in-context-recall", "memorization"]\n'))
    with pytest.raises(SystemExit, match=message):
        main(["--config", config, "--mixers", "attention", "--out", str(tmp_path / "out"), "--device", "cpu"])
    assert not (tmp_path / "out").exists()


def test_an_int_for_a_float_data_key_is_the_same_config(tmp_path):
    """[data] `frac_noise = 0` and `frac_noise = 0.0` make the same settings, but the config id hashed
    [data] as written: a rerun with the other spelling refused the grid's runs as another config's."""
    from eval.mad.grid import config_id

    ids = []
    for spelling in ("0", "0.0"):
        text = TINY.replace("num_test_examples = 16", f"num_test_examples = 16\nfrac_noise = {spelling}")
        cfg = load_config(_config(tmp_path, text, f"{spelling}.toml"))
        ids.append((config_id(cfg), cfg.settings()))
    assert ids[0] == ids[1]


def test_a_best_run_of_an_unfinished_sweep_says_so(tmp_path, monkeypatch):
    """The best run of a setting whose lr / weight-decay sweep had not finished stood beside another
    mixer's best of a whole sweep, with nothing in the table to tell them apart."""
    config = _config(tmp_path)
    out = _grid(tmp_path, monkeypatch, config)  # ICR and MEM x lrs 5e-3, 1e-3 of attention
    runs = (out / "runs.jsonl").read_text().splitlines()
    kept = [line for line in runs if (json.loads(line)["task"], json.loads(line)["lr"]) != ("memorization", 1e-3)]
    (out / "runs.jsonl").write_text("\n".join(kept) + "\n")
    assert main(["--config", config, "--mixers", "attention", "--out", str(out), "--report-only"]) == 0
    rows = {line.split("|")[1].strip(): line.split("|")[2].strip()
            for line in (out / "table.md").read_text().splitlines() if line.startswith("| ICR(") or
            line.startswith("| MEM(")}
    assert rows[next(s for s in rows if s.startswith("MEM"))] == "0.500, 0.600 (lr 0.005, wd 0.1; 1 of 2 runs)"
    assert rows[next(s for s in rows if s.startswith("ICR"))].endswith("wd 0.1)")


def test_results_json_of_a_diverged_run_is_strict_json(tmp_path):
    """A run whose loss went non-finite records final_loss NaN: results.json held a bare NaN, which
    strict JSON readers (jq, JSON.parse) refuse; it is null there now, runs.jsonl is unchanged."""
    from eval.mad.report import write_report

    run = {"task": "in-context-recall", "setting": "ICR(x)", "params": {}, "mixer": "attention", "lr": 1e-3,
           "weight_decay": 0.0, "test_acc": 0.1, "test_acc_micro": 0.1, "final_loss": math.nan, "finite": False}
    write_report([run, {**run, "lr": 5e-3, "final_loss": math.inf}], str(tmp_path), "diverged")

    def refuse(constant):
        raise ValueError(f"bare {constant} in results.json")

    summary = json.loads((tmp_path / "results.json").read_text(), parse_constant=refuse)
    assert [r["final_loss"] for r in summary["runs"]] == [None, None] and summary["best"][0]["final_loss"] is None
    assert math.isnan(run["final_loss"])  # the caller's records are left as they are


def test_tokens_copied_with_mad_lab_cached_copies_is_refused(tmp_path, monkeypatch):
    """"mad_lab_cached" sets tokens_copied = 16 wherever num_tokens_to_copy is not 16: a [data]
    tokens_copied would hold in some settings and be replaced in the others (the 32-, 64- and 96-token
    settings would copy 16 tokens, not the 8 asked for)."""
    from eval.mad import runner

    with pytest.raises(ValueError, match=r"tokens_copied = 8 \(\[data\]\): selective_copy = 'mad_lab_cached'"):
        task_settings("selective-copying", "mad", selective_copy="mad_lab_cached", tokens_copied=8)
    text = TINY.replace('tasks = ["in-context-recall", "memorization"]\nsweep = "baseline"',
                        'tasks = ["selective-copying"]\nsweep = "mad"\nselective_copy = "mad_lab_cached"')
    config = _config(tmp_path, text.replace("num_test_examples = 16", "num_test_examples = 16\ntokens_copied = 8"))
    calls = []
    monkeypatch.setattr(runner, "run_job", fake_runs(calls))
    with pytest.raises(SystemExit, match=r"tokens_copied = 8 \(\[data\]\).*expected tokens_copied left out"):
        main(["--config", config, "--mixers", "attention", "--out", str(tmp_path / "out"), "--device", "cpu"])
    assert not calls and not (tmp_path / "out").exists()
    # either one alone is a grid: the cached data's 16 copies, or 8 copies in every setting
    assert {s.tokens_copied for s in load_config(_config(tmp_path, text, "cached.toml")).settings()} == {0, 16}
    assert {s.tokens_copied for s in task_settings("selective-copying", "mad", tokens_copied=8)} == {8}


@pytest.mark.parametrize("train, options, message", [
    ("min_lr = 1e-4", [], r"\[train\] min_lr = 0.0001: the 'wsd' schedule decays to 0 and does not read it"),
    ('schedule = "cosine"\ndecay_frac = 0.5', [],
     r"\[train\] decay_frac = 0.5: the 'cosine' schedule does not read it"),
    ("decay_frac = 0.5", ["--schedule", "cosine"], r"\[train\] decay_frac = 0.5: the 'cosine' schedule"),
    ('schedule = "cosine"\nmin_lr = 2e-3', [],
     r"\[train\] min_lr = 0.002: above the learning rates \[0.001\] of lrs"),
    ('schedule = "cosine"\nmin_lr = 1e-4', ["--lrs", "5e-5,1e-3"],
     r"\[train\] min_lr = 0.0001: above the learning rates \[5e-05\] of lrs"),
])
def test_a_schedule_key_the_schedule_cannot_use_is_refused(tmp_path, monkeypatch, train, options, message):
    """WSD decays to 0 and does not read min_lr; cosine does not read decay_frac; a cosine floor above
    a learning rate raises that run's lr up to the floor: each run would differ from what the key asks,
    under a config id other than the key-less config's."""
    from eval.mad import runner

    calls = []
    monkeypatch.setattr(runner, "run_job", fake_runs(calls))
    config = _config(tmp_path, TINY.replace('precision = "fp32"', f'precision = "fp32"\n{train}'))
    with pytest.raises(SystemExit, match=message):
        main(["--config", config, "--mixers", "attention", "--out", str(tmp_path / "out"), "--device", "cpu",
              *options])
    assert not calls and not (tmp_path / "out").exists()


def test_a_schedule_key_the_schedule_uses_is_accepted(tmp_path, monkeypatch):
    """Cosine to a floor at or below every learning rate, and WSD with its own decay fraction, run."""
    for name, train in (("cos.toml", 'schedule = "cosine"\nmin_lr = 1e-3'), ("wsd.toml", "decay_frac = 0.5")):
        config = _config(tmp_path, TINY.replace('precision = "fp32"', f'precision = "fp32"\n{train}'), name)
        _grid(tmp_path / name.split(".")[0], monkeypatch, config)
