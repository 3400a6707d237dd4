"""Hostile arguments to the evaluation commands: each is refused by name before any checkpoint is
checked or loaded, or changes what the outputs say (fast: no model is built)."""

from __future__ import annotations

import re

import pytest

import eval.lm_eval as cli
from eval.mad.__main__ import main as mad_main
from eval.mad.grid import RunConfig, load_config
from eval.model import ParallaxLM
from eval.table import markdown_table


@pytest.fixture
def no_loading(monkeypatch):
    """eval.lm_eval with checksum checks and model loads that fail the test when reached; the
    calls of the (fake) scoring are recorded in the returned list."""
    calls = []

    def verify(*args, **kwargs):
        calls.append("verify")

    def load(*args, **kwargs):
        raise AssertionError("a model was loaded before the arguments were checked")

    monkeypatch.setattr(cli, "verify_before_load", verify)
    monkeypatch.setattr(ParallaxLM, "from_checkpoint", classmethod(load))
    monkeypatch.setattr(ParallaxLM, "from_job_config", classmethod(load))
    return calls


def cli_args(tmp_path, *extra):
    return ["--config", "X.toml", "--checkpoint", str(tmp_path / "run" / "checkpoint" / "step-1"),
            "--output", str(tmp_path / "out"), "--device", "cpu", *extra]


# (option, the API's key, the option's text, its value through the API, what is expected): one rule each
COUNT_CASES = [
    ("--limit", "limit", "-1", -1, "0 (all documents) or a positive count"),
    ("--limit", "limit", "ten", "ten", "0 (all documents) or a positive count"),
    ("--batch-size", "batch_size", "0", 0, "a positive integer"),
    ("--batch-size", "batch_size", "2.5", 2.5, "a positive integer"),
    ("--max-length", "max_length", "-4", -4, "0 (training seq_len) or a positive length"),
    ("--bootstrap-iters", "bootstrap_iters", "-1", -1, "0 (no standard errors) or a positive count"),
]


@pytest.mark.parametrize("flag, key, text, value, expected", COUNT_CASES)
def test_cli_counts_are_checked_by_their_option(tmp_path, capsys, no_loading, flag, key, text, value, expected):
    """The option's own name (the API's check says `limit:` for `--limit`), with the API's expectation."""
    with pytest.raises(SystemExit) as exit_info:
        cli.main(cli_args(tmp_path, flag, text))
    assert exit_info.value.code == 2
    typed = int(text) if text.lstrip("-").isdigit() else text
    assert f"argument {flag}: got {typed!r}; expected {expected}" in capsys.readouterr().err
    assert no_loading == []


@pytest.mark.parametrize("flag, key, text, value, expected", COUNT_CASES + [
    (None, "batch_size", None, True, "a positive integer"),
    (None, "limit", None, None, "0 (all documents) or a positive count"),
])
def test_api_counts_are_checked_by_their_key(tmp_path, no_loading, flag, key, text, value, expected):
    """evaluate_checkpoints names the key it was given, with the same rule as the command's option."""
    settings = {"limit": 0, "batch_size": 8, "max_length": 0, "bootstrap_iters": 0, key: value}
    with pytest.raises(ValueError, match=re.escape(f"{key}: got {value!r}; expected {expected}")):
        cli.evaluate_checkpoints(["X.toml"], [str(tmp_path / "step-1")], tasks=["boolq"], output=str(tmp_path / "out"),
                                 device="cpu", **settings)
    assert no_loading == []


@pytest.mark.parametrize("flag, value, name", [
    ("--dtype", "fp8", "dtype"),
    # torch failed on these only when the model was built (a traceback), after every checksum was read
    ("--device", "gpu", "device"), ("--device", "cuda:99", "device"), ("--device", "meta", "device"),
])
def test_cli_settings_are_checked_before_any_checkpoint(tmp_path, capsys, no_loading, flag, value, name):
    assert cli.main(cli_args(tmp_path, flag, value)) == 2
    err = capsys.readouterr().err
    assert f"{name}:" in err and value in err
    assert no_loading == []  # not even the checksums were read


def test_cli_output_that_is_a_file_is_refused_before_scoring(tmp_path, capsys, no_loading):
    (tmp_path / "out").write_text("not a folder")
    assert cli.main(cli_args(tmp_path)) == 2
    assert "output:" in capsys.readouterr().err and no_loading == []


def test_cli_empty_output_is_refused_before_scoring(tmp_path, capsys, no_loading):
    """--output "" passed every check: the table's makedirs failed after every checkpoint was scored."""
    args = cli_args(tmp_path)
    args[args.index("--output") + 1] = ""
    assert cli.main(args) == 2
    assert "output: got ''" in capsys.readouterr().err and no_loading == []


def test_cli_output_under_a_file_is_refused_and_nothing_is_created(tmp_path, capsys, no_loading):
    (tmp_path / "blocker").write_text("a file where a folder would go")
    args = cli_args(tmp_path)
    args[args.index("--output") + 1] = str(tmp_path / "blocker" / "out")
    assert cli.main(args) == 2
    assert "output:" in capsys.readouterr().err and no_loading == []
    assert sorted(p.name for p in tmp_path.iterdir()) == ["blocker"]


def test_cli_missing_task_file_is_refused_before_scoring(tmp_path, capsys, no_loading):
    (tmp_path / "data").mkdir()
    assert cli.main(cli_args(tmp_path, "--tasks", "boolq", "--data-dir", str(tmp_path / "data"))) == 2
    assert "data_dir:" in capsys.readouterr().err and no_loading == []


def test_cli_empty_task_file_is_refused_before_scoring(tmp_path, capsys, no_loading):
    """A 0-byte boolq.jsonl passed the file's check: the model was loaded, then lm-eval stopped on a
    bare StopIteration traceback (exit code 1)."""
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "boolq.jsonl").write_bytes(b"")
    assert cli.main(cli_args(tmp_path, "--tasks", "boolq", "--data-dir", str(tmp_path / "data"))) == 2
    err = capsys.readouterr().err
    assert f"data_dir: {str(tmp_path / 'data' / 'boolq.jsonl')!r} is empty; expected the 'validation' split" in err
    assert no_loading == []


@pytest.mark.parametrize("taken", ["results.md", "new.json"])
def test_cli_output_file_names_taken_by_folders_are_refused_before_scoring(tmp_path, capsys, no_loading, taken):
    """A folder called results.md in --output: every row was scored, its JSON written, and then the
    table's rename failed (IsADirectoryError, exit code 1, no table)."""
    (tmp_path / "out" / taken).mkdir(parents=True)
    assert cli.main(cli_args(tmp_path, "--names", "new")) == 2
    err = capsys.readouterr().err
    assert f"output: {str(tmp_path / 'out' / taken)!r} is a folder or another non-file" in err and no_loading == []


@pytest.mark.parametrize("value", ["", "  ", " , "])
def test_cli_empty_tasks_are_refused_not_read_as_the_suite(tmp_path, capsys, no_loading, value):
    """An explicit --tasks naming no task (e.g. an unset shell variable) is refused by name; only a
    missing --tasks means the whole suite."""
    assert cli.main(cli_args(tmp_path, "--tasks", value)) == 2
    err = capsys.readouterr().err
    assert f"--tasks: got {value!r}, which names no task" in err and no_loading == []


def test_cli_output_with_rows_of_an_earlier_scoring_is_refused(tmp_path, capsys, no_loading):
    """An earlier scoring's JSON files stayed beside a results.md that no longer listed them; the rows
    scored again are the ones their files hold."""
    out = tmp_path / "out"
    out.mkdir()
    (out / "old_step-9.json").write_text("{}")
    args = ["--config", "X.toml", "--checkpoint", str(tmp_path / "run" / "step-1"), "--names", "new",
            "--output", str(out)]
    assert cli.main(args) == 2
    assert "output: " in (err := capsys.readouterr().err) and "old_step-9.json of rows this run does not score" in err
    assert no_loading == [] and (out / "old_step-9.json").read_text() == "{}"
    (out / "old_step-9.json").rename(out / "new.json")  # the same row scored again: its file is replaced
    cli.check_outputs(str(out), ["new"])


def test_cli_rows_that_would_share_a_json_file_are_refused(tmp_path, capsys, no_loading):
    """Two runs called "run" in different folders: both rows "run/step-1", one JSON file."""
    checkpoints = [str(tmp_path / d / "run" / "checkpoint" / "step-1") for d in ("a", "b")]
    args = ["--config", "X.toml", "--checkpoint", *checkpoints, "--output", str(tmp_path / "out")]
    assert cli.main(args) == 2
    err = capsys.readouterr().err
    assert "names:" in err and "run/step-1" in err and "--names" in err and no_loading == []
    assert cli.main([*args, "--names", "a/x", "a_x"]) == 2  # distinct names, one file name
    assert "a_x.json" in capsys.readouterr().err


@pytest.mark.parametrize("name, problem", [("", "is blank"), ("  ", "is blank"), ("a|b", "holds '|'"),
                                           ("a\nb", "holds a line break")])
def test_cli_row_names_the_table_cannot_show_are_refused(tmp_path, capsys, no_loading, name, problem):
    """--names "" (an unset shell variable) was taken: the row's JSON became the hidden file `.json` and
    its row had no name; a `|` split the row's name into two cells, shifting every score a column."""
    assert cli.main(cli_args(tmp_path, "--names", name)) == 2
    err = capsys.readouterr().err
    assert f"names: got {name!r}, which {problem}" in err and no_loading == []
    assert not (tmp_path / "out").exists()


def test_cli_empty_data_dir_is_refused_not_read_as_the_hub(tmp_path, capsys, no_loading):
    """--data-dir "" (an unset shell variable) was taken for no --data-dir: the model was loaded and lm-eval
    then read every task from the Hugging Face hub (offline: a ConnectionError traceback, exit code 1)."""
    config, checkpoint = one_run(tmp_path)
    for value in ("", " "):
        args = ["--config", config, "--checkpoint", checkpoint, "--output", str(tmp_path / "out"), "--device", "cpu",
                "--tasks", "piqa", "--data-dir", value]
        assert cli.main(args) == 2
        assert f"data_dir: got {value!r}, which names no folder" in capsys.readouterr().err
    assert no_loading == [] and not (tmp_path / "out").exists()


@pytest.mark.parametrize("tasks, message", [
    (["nope"], "tasks: got ['nope']; expected 'paper' or names from"),
    ([], "tasks: got [], which names no task"),
    ("nope,piqa", "tasks: got 'nope,piqa'; expected 'paper' or names from"),
])
def test_api_tasks_are_checked_before_any_checkpoint_is_loaded(tmp_path, no_loading, tasks, message):
    """evaluate_checkpoints(tasks=...) took any list: an unknown name (or "piqa" as a string, read letter
    by letter) failed in lm-eval (KeyError "Spec 'p' is not a registered task") after the model was loaded."""
    config, checkpoint = one_run(tmp_path)
    with pytest.raises(ValueError, match=re.escape(message)):
        cli.evaluate_checkpoints([config], [checkpoint], tasks=tasks, output=str(tmp_path / "out"), device="cpu")
    assert no_loading == [] and not (tmp_path / "out").exists()


def test_api_tasks_as_a_comma_separated_string_are_the_named_tasks(tmp_path, no_loading, monkeypatch):
    """A string is split at commas as --tasks is (it was taken letter by letter)."""
    config, checkpoint = one_run(tmp_path)
    scored = []
    monkeypatch.setattr(ParallaxLM, "from_job_config", classmethod(lambda cls, *a, **k: "lm"))
    monkeypatch.setattr(cli, "evaluate", lambda lm, tasks, **kwargs: scored.append(tasks) or {"results": {}})
    cli.evaluate_checkpoints([config], [checkpoint], tasks="piqa, boolq", output=str(tmp_path / "out"), device="cpu")
    assert scored == [["piqa", "boolq"]]


def saved_checkpoint(folder, config: str) -> str:
    """A trainer-like checkpoint (weights, manifest, settings.json) of ``config``'s freshly built model."""
    import torch

    from eval.checkpoint import build_model, load_job_config, model_args_of
    from parallax_titan.checkpointing import save_checksummed
    from parallax_titan.resume_rules import run_settings, write_settings

    job = load_job_config(config)
    save_checksummed(build_model(model_args_of(job), torch.device("cpu")).state_dict(), str(folder))
    write_settings(str(folder), 1, run_settings(job, 1))
    return str(folder)


def one_run(tmp_path) -> tuple[str, str]:
    """test_cpu_2rank.toml and a checkpoint of its model (run "run", step 1)."""
    import os

    from tests._train_runs import REPO

    config = os.path.join(REPO, "configs", "test_cpu_2rank.toml")
    return config, saved_checkpoint(tmp_path / "run" / "checkpoint" / "step-1", config)


def two_runs(tmp_path):
    """test_cpu_2rank.toml, a copy naming the Transformer, and two checkpoints of the former (runs a, b)."""
    import os

    from tests._train_runs import REPO

    parallax = os.path.join(REPO, "configs", "test_cpu_2rank.toml")
    transformer = tmp_path / "transformer.toml"
    transformer.write_text(open(parallax).read().replace('name = "parallax"', 'name = "transformer"'))
    checkpoints = [saved_checkpoint(tmp_path / run / "checkpoint" / "step-1", parallax) for run in ("a", "b")]
    return parallax, str(transformer), checkpoints


def test_cli_every_config_and_pairing_is_checked_before_the_first_checkpoint_is_scored(tmp_path, capsys,
                                                                                        no_loading):
    """With one --config per checkpoint, a missing second config or a second checkpoint of another
    model than its config's was found only when its turn came, after the first checkpoint had been
    scored (hours), and the table of the rows before it was never written."""
    parallax, transformer, checkpoints = two_runs(tmp_path)
    args = ["--checkpoint", *checkpoints, "--output", str(tmp_path / "out"), "--device", "cpu"]
    assert cli.main(["--config", parallax, str(tmp_path / "missing.toml"), *args]) == 2
    assert f"config: '{tmp_path / 'missing.toml'}' is not a file" in capsys.readouterr().err
    assert cli.main(["--config", parallax, str(transformer), *args]) == 2
    assert f"checkpoint: '{checkpoints[1]}' holds another model than the config's" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


def test_cli_reads_each_checkpoints_metadata_once(tmp_path, monkeypatch):
    """The check before scoring and the load read a checkpoint's DCP metadata and settings.json once
    between them: the load takes the check's verdict (they were read twice, once in the check and
    again in the load)."""
    import torch

    import eval.checkpoint as ckpt

    parallax, _, checkpoints = two_runs(tmp_path)
    reads = []

    def counted(name):
        real = getattr(ckpt, name)

        def read(folder, *args):
            reads.append((name, folder))
            return real(folder, *args)
        return read

    for name in ("saved_shapes", "check_model_settings"):
        monkeypatch.setattr(ckpt, name, counted(name))
    scored = []

    def evaluate(lm, tasks, **kwargs):
        scored.append(lm.model)
        return {"results": {"boolq": {"acc,none": 0.5}}, "n-samples": {"boolq": {"original": 2, "effective": 2}},
                "config": {"limit": None}}

    monkeypatch.setattr(cli, "evaluate", evaluate)
    # verify=False: the fixture's settings.json comes after its manifest, which does not list it; the
    # checksums are not what this test counts
    cli.evaluate_checkpoints([parallax], checkpoints, tasks=["boolq"], output=str(tmp_path / "out"), device="cpu",
                             verify=False)
    assert sorted(reads) == sorted((name, c) for name in ("saved_shapes", "check_model_settings") for c in checkpoints)
    assert (tmp_path / "out" / "results.md").exists()
    for model, checkpoint in zip(scored, checkpoints, strict=True):  # each row scored its checkpoint's weights
        saved = ckpt.build_model(model.model_args, torch.device("cpu"))
        ckpt.load_checkpoint(saved, checkpoint, verify=False)
        assert all(torch.equal(model.state_dict()[k], v) for k, v in saved.state_dict().items())


def test_load_model_refuses_another_models_checkpoint_before_building_one(tmp_path, monkeypatch):
    """[eval] at_end, scripts/generate.py and export load through load_model alone: the checkpoint is
    checked against the config's model on the meta device before the model is built (it was built,
    weights allocated and initialised, then refused)."""
    import eval.checkpoint as ckpt

    _, transformer, checkpoints = two_runs(tmp_path)
    built = []
    real_build = ckpt.build_model
    monkeypatch.setattr(ckpt, "build_model", lambda *args: built.append(args) or real_build(*args))
    with pytest.raises(ValueError, match="holds another model than the config's"):
        ckpt.load_model(ckpt.load_job_config(transformer), checkpoints[0], device="cpu", verify=False)
    assert built == []


def test_load_model_refuses_the_verdict_on_another_folder_or_model(tmp_path):
    """A verdict stands for its folder and model only: the weights of an unchecked checkpoint, or a
    model of another window, are not loaded under it."""
    from eval.checkpoint import check_job_checkpoint, load_job_config, load_model

    parallax, transformer, checkpoints = two_runs(tmp_path)
    job = load_job_config(parallax)
    verdict = check_job_checkpoint(job, checkpoints[0])
    with pytest.raises(ValueError, match=re.escape(f"checked: a verdict on {checkpoints[0]!r}")):
        load_model(job, checkpoints[1], device="cpu", verify=False, checked=verdict)
    with pytest.raises(ValueError, match=re.escape(f"expected check_job_checkpoint's verdict on {checkpoints[0]!r}")):
        load_model(job, checkpoints[0], device="cpu", verify=False, max_length=64, checked=verdict)
    with pytest.raises(ValueError, match="checked: "):
        load_model(load_job_config(transformer), checkpoints[0], device="cpu", verify=False, checked=verdict)
    model, _ = load_model(job, checkpoints[0], device="cpu", verify=False, checked=verdict)
    assert model.model_args == verdict.args


def test_table_says_when_a_limit_cut_the_documents():
    full = {"results": {"boolq": {"acc,none": 0.5}}, "n-samples": {"boolq": {"original": 20, "effective": 20}},
            "config": {"limit": None}}
    cut = {"results": {"boolq": {"acc,none": 0.5}}, "n-samples": {"boolq": {"original": 20, "effective": 5}},
           "config": {"limit": 5}}
    assert "limit" not in markdown_table([("full", full)])
    table = markdown_table([("full", full), ("cut", cut)])
    rows = [line for line in table.splitlines() if line.startswith("| cut")]
    assert rows and rows[0].startswith("| cut†")
    assert "† scored on part of each task's documents" in table and "boolq 5 of 20" in table


def test_from_job_config_checks_sizes_before_loading(monkeypatch):
    import eval.model

    def load(*args, **kwargs):
        raise AssertionError("loaded before batch_size was checked")

    monkeypatch.setattr(eval.model, "load_model", load)
    with pytest.raises(ValueError, match="batch_size: got 'auto'"):
        ParallaxLM.from_job_config(None, "DIR", batch_size="auto")
    with pytest.raises(ValueError, match="max_gen_toks: got 0"):
        ParallaxLM.from_job_config(None, "DIR", max_gen_toks=0)
    for bad in ("abc", "4.5", -8):  # model_args passes text; "abc" was a TypeError inside the model build
        with pytest.raises(ValueError, match=f"max_length: got {bad!r}; expected a positive integer"):
            ParallaxLM.from_job_config(None, "DIR", max_length=bad)


@pytest.fixture
def fake_checkpoint(monkeypatch):
    calls = []

    def from_checkpoint(cls, config, checkpoint, **kwargs):
        calls.append((config, checkpoint, kwargs))
        return "lm"

    monkeypatch.setattr(ParallaxLM, "from_checkpoint", classmethod(from_checkpoint))
    return calls


def test_model_args_as_a_dict_build_the_adapter(fake_checkpoint):
    """lm_eval.simple_evaluate(model="parallax_titan", model_args={...}) goes through create_from_arg_obj."""
    assert ParallaxLM.create_from_arg_obj({"config": "X.toml", "checkpoint": "D", "verify": False},
                                          {"batch_size": 2, "max_batch_size": None, "device": None}) == "lm"
    config, checkpoint, kwargs = fake_checkpoint[0]
    assert (config, checkpoint, kwargs["batch_size"], kwargs["verify"]) == ("X.toml", "D", 2, False)


def test_model_args_that_lm_eval_would_override_are_refused(fake_checkpoint):
    """The lm_eval command hands every model batch_size 1 and device cuda:0 unless --batch_size and
    --device are given; device=cpu,batch_size=16 in model_args used to be replaced by them silently."""
    lm_eval_defaults = {"batch_size": 1, "max_batch_size": None, "device": "cuda:0"}
    with pytest.raises(ValueError, match=r"model_args: device='cpu' in model_args but 'cuda:0' from lm-eval; "
                                         r"batch_size=16 in model_args but 1 from lm-eval"):
        ParallaxLM.create_from_arg_string("config=X.toml,checkpoint=D,device=cpu,batch_size=16", lm_eval_defaults)
    assert fake_checkpoint == []
    # the same value in both places (lm_eval's --batch_size is a string), or each in one place: taken
    ParallaxLM.create_from_arg_obj({"config": "X.toml", "checkpoint": "D", "device": "cpu", "batch_size": 16},
                                   {"batch_size": "16", "device": "cpu"})
    ParallaxLM.create_from_arg_obj({"config": "X.toml", "checkpoint": "D", "device": "cpu"}, {"batch_size": "4"})
    assert [(kw["device"], int(kw["batch_size"])) for _, _, kw in fake_checkpoint] == [("cpu", 16), ("cpu", 4)]


@pytest.mark.parametrize("batch_size", [0, "0"])
def test_lm_eval_batch_size_zero_is_refused_not_replaced(monkeypatch, batch_size):
    """simple_evaluate(model="parallax_titan", batch_size=0) was dropped as unset: the adapter scored
    with its default batch size 8 (or model_args' batch size) instead of refusing it."""
    monkeypatch.setattr("eval.model.load_job_config", lambda *args: None)  # the check comes before the load
    monkeypatch.setattr("eval.model.load_model", lambda *args, **kwargs: pytest.fail("the checkpoint was loaded"))
    with pytest.raises(ValueError, match=f"batch_size: got {batch_size!r}; expected a positive integer"):
        ParallaxLM.create_from_arg_obj({"config": "X.toml", "checkpoint": "D"},
                                       {"batch_size": batch_size, "max_batch_size": None, "device": None})
    with pytest.raises(ValueError, match=f"batch_size=4 in model_args but {batch_size!r} from lm-eval"):
        ParallaxLM.create_from_arg_obj({"config": "X.toml", "checkpoint": "D", "batch_size": 4},
                                       {"batch_size": batch_size})


def test_unknown_model_args_are_named(fake_checkpoint):
    with pytest.raises(ValueError, match=r"model_args: unknown \['batchsize'\].*batch_size"):
        ParallaxLM.create_from_arg_string("config=X.toml,checkpoint=D,batchsize=4")
    with pytest.raises(ValueError, match="model_args: config= is missing"):
        ParallaxLM.create_from_arg_obj({"checkpoint": "D"})
    assert fake_checkpoint == []


# ---------------------------------------------------------------------------------------- MAD
MAD_SECTIONS = {
    "grid": {"tasks": '["in-context-recall"]', "sweep": '"baseline"'},
    "train": {"epochs": "1", "batch_size": "16", "lrs": "[1e-3]", "weight_decays": "[0.0]"},
}


def mad_toml(**changes: str) -> str:
    """A tiny MAD config; ``changes``: ``section__key="TOML value"``."""
    sections = {name: dict(keys) for name, keys in MAD_SECTIONS.items()}
    for name, value in changes.items():
        section, key = name.split("__")
        sections.setdefault(section, {})[key] = value
    return "".join(f"[{name}]\n" + "".join(f"{k} = {v}\n" for k, v in keys.items()) for name, keys in sections.items())


MAD_TOML = mad_toml()


def test_mad_training_size_override_plans_each_setting_once():
    """A num_train_examples override makes MAD's training-size changes equal to the baseline:
    one setting (and one planned run), not five."""
    settings = RunConfig(tasks=["in-context-recall"], sweep="mad", data={"num_train_examples": 100}).settings()
    assert len(settings) == len(set(settings)) == 7
    assert len(RunConfig(tasks=["in-context-recall", "in-context-recall"], sweep="baseline").settings()) == 1


@pytest.mark.parametrize("change, key", [
    ({"train__epochs": "0"}, "[train] epochs"), ({"train__batch_size": "0"}, "[train] batch_size"),
    ({"train__lrs": "[0.0]"}, "[train] lrs"), ({"train__lrs": "[]"}, "[train] lrs"),
    ({"train__weight_decays": "[-0.1]"}, "[train] weight_decays"), ({"train__decay_frac": "1.5"}, "[train] decay_frac"),
    ({"data__num_train_examples": "0"}, "[data] num_train_examples"), ({"model__dim": "0"}, "[model] dim"),
])
def test_mad_config_values_that_cannot_make_a_run_are_refused(tmp_path, change, key):
    path = tmp_path / "c.toml"
    path.write_text(mad_toml(**change))
    with pytest.raises(ValueError, match=re.escape(f"{path}: {key} = ")):
        load_config(str(path))


@pytest.mark.parametrize("flag, value", [
    ("--epochs", "0"), ("--epochs", "-2"), ("--num-train-examples", "0"), ("--num-test-examples", "0"),
    ("--lrs", "1e-3,abc"), ("--lrs", "0"), ("--wds", "x"), ("--max-run-seconds", "-1"),
    ("--workers", "-1"), ("--threads", "0"), ("--deadline", "0"),
])
def test_mad_cli_values_are_checked_not_ignored(tmp_path, flag, value):
    config = tmp_path / "c.toml"
    config.write_text(MAD_TOML)
    with pytest.raises(SystemExit, match=flag):
        mad_main(["--config", str(config), "--out", str(tmp_path / "out"), "--report-only", flag, value])


def test_mad_cli_zero_run_seconds_turns_the_configs_budget_off(tmp_path):
    from eval.mad import __main__ as mad_cli

    config = tmp_path / "c.toml"
    config.write_text(mad_toml(train__max_seconds="60.0"))
    args = mad_cli._parser().parse_args(["--config", str(config), "--out", "o", "--max-run-seconds", "0"])
    assert mad_cli._apply_overrides(load_config(str(config)), args).train.max_seconds == 0


# ---------------------------------------------------------------------------------------- hand-off
def test_downstream_data_dir_is_checked_when_training_starts(tmp_path):
    """[eval] every_n_steps with a data_dir lacking a task's file: refused when the evaluator is built
    (before the first training step), not at the first evaluation step."""
    import os

    from eval.downstream import DownstreamEvaluator
    from parallax_titan.config import load_config as load_job
    from tests._train_runs import REPO

    config = load_job(["--job.config_file", os.path.join(REPO, "configs", "test_cpu_2rank.toml"),
                       "--eval.every_n_steps", "3", "--eval.tasks", "boolq", "--eval.data_dir", str(tmp_path)],
                      check_data=False)
    with pytest.raises(ValueError, match="data_dir: .* no file for task 'boolq'"):
        DownstreamEvaluator(config)


def test_at_end_data_dir_is_checked_before_training(tmp_path):
    """[eval] at_end with a data_dir lacking a task's file failed only when the final evaluation
    started, after the last training step; train.py now calls check_before_training first (exit code 2)."""
    import os

    from eval.at_end import check_before_training
    from parallax_titan.config import ConfigError
    from parallax_titan.config import load_config as load_job
    from tests._train_runs import REPO

    def config(*overrides):
        return load_job(["--job.config_file", os.path.join(REPO, "configs", "test_cpu_2rank.toml"), "--eval.at_end",
                         "--eval.tasks", "boolq,piqa", *overrides], check_data=False)

    (tmp_path / "boolq.jsonl").write_text("{}\n")
    with pytest.raises(ConfigError, match=r"eval.data_dir: .* has no file for task 'piqa'; expected piqa.jsonl"):
        check_before_training(config("--eval.data_dir", str(tmp_path)))
    check_before_training(config("--eval.data_dir", os.path.join(REPO, "tests", "fixtures", "lm_eval")))
    check_before_training(config())  # no data_dir: the hub or its cache, read when the evaluation runs


def test_at_end_device_this_machine_lacks_is_refused_before_training():
    """A well-formed eval.device of a CUDA device the machine lacks passed the config's name check
    and failed only when the final evaluation built its model, after the last training step."""
    import os

    import torch

    from eval.at_end import check_before_training
    from parallax_titan.config import ConfigError
    from parallax_titan.config import load_config as load_job
    from tests._train_runs import REPO

    def config(*overrides):
        return load_job(["--job.config_file", os.path.join(REPO, "configs", "test_cpu_2rank.toml"), "--eval.tasks",
                         "boolq", *overrides], check_data=False)

    lacking = f"cuda:{torch.cuda.device_count()}"
    with pytest.raises(ConfigError, match=rf"eval.device: got '{lacking}', but this machine has "):
        check_before_training(config("--eval.at_end", "--eval.device", lacking))
    check_before_training(config("--eval.at_end", "--eval.device", "cpu"))
    check_before_training(config("--eval.every_n_steps", "3", "--eval.device", lacking))  # at_end reads it only


def test_train_refuses_a_downstream_data_dir_without_the_task_files_with_exit_code_2(tmp_path):
    """train.py with [eval] every_n_steps and a data_dir lacking a task's file: exit code 2 and the key
    named, before training (the evaluator's ValueError used to end the run with a traceback)."""
    import os
    import subprocess
    import sys

    from tests._train_runs import REPO

    result = subprocess.run([sys.executable, "train.py", "--job.config_file", os.path.join(REPO, "configs",
                             "demo_cpu.toml"), "--job.dump_folder", str(tmp_path / "run"), "--eval.every_n_steps",
                             "10", "--eval.tasks", "boolq", "--eval.data_dir", str(tmp_path)],
                            cwd=REPO, capture_output=True, text=True)
    assert result.returncode == 2, result.stderr[-2000:]
    assert "eval.data_dir:" in result.stderr and "no file for task 'boolq'" in result.stderr
    assert "Traceback" not in result.stderr and not (tmp_path / "run").exists()


def _config_with_eval(tmp_path, eval_table: str):
    """test_cpu_2rank.toml with ``eval_table`` as its [eval] section, loaded without the data checks."""
    import os

    from parallax_titan.config import load_config as load_job
    from tests._train_runs import REPO

    path = tmp_path / "eval.toml"
    path.write_text(open(os.path.join(REPO, "configs", "test_cpu_2rank.toml")).read() + "\n[eval]\n" + eval_table)
    return load_job(["--job.config_file", str(path)], check_data=False)


@pytest.mark.parametrize("eval_table, message", [
    ("at_end = true\ntasks = []\n", "eval.tasks: empty with eval.at_end = True and eval.every_n_steps = 0"),
    ("every_n_steps = 5\ntasks = []\n", "eval.every_n_steps = 5; expected at least one task"),
    ('tasks = ["boolq", "piqa", "boolq"]\n', r"eval.tasks: \['boolq'\] given more than once"),
])
def test_eval_tasks_empty_while_evaluating_or_repeated_are_refused(tmp_path, eval_table, message):
    from parallax_titan.config import ConfigError

    with pytest.raises(ConfigError, match=message):
        _config_with_eval(tmp_path, eval_table)


def test_eval_tasks_empty_without_evaluation_is_accepted(tmp_path):
    config = _config_with_eval(tmp_path, "tasks = []\n")
    assert config.eval.tasks == [] and not config.eval.at_end and config.eval.every_n_steps == 0


def test_prefetch_unknown_task_is_an_error_not_a_traceback(capsys):
    from eval import prefetch

    with pytest.raises(SystemExit) as exit_info:
        prefetch.main(["--tasks", "boolq,mmlu", "--list"])
    assert exit_info.value.code == 2
    assert "tasks: got 'boolq,mmlu'" in capsys.readouterr().err


@pytest.fixture
def no_download(monkeypatch):
    import datasets

    def download(*args, **kwargs):
        raise AssertionError("downloaded before --jsonl-dir was checked")

    monkeypatch.setattr(datasets, "load_dataset", download)


@pytest.mark.parametrize("layout, message", [
    ("empty", "--jsonl-dir: got '', which names no folder"), ("file", "is a file"),
    ("under_file", "cannot create or write"), ("task_folder", "boolq.jsonl' is a folder"),
    ("with_list", "with --list, which only prints"),
])
def test_prefetch_jsonl_dir_is_checked_before_downloading(tmp_path, capsys, no_download, layout, message):
    """A file there failed after the first dataset's download; --jsonl-dir "" (an unset shell
    variable) wrote no file without a word, as did --jsonl-dir beside --list."""
    from eval import prefetch

    folder = {"empty": "", "file": tmp_path / "f", "under_file": tmp_path / "f" / "sub"}.get(layout, tmp_path / "d")
    if layout in ("file", "under_file"):
        (tmp_path / "f").write_text("a file")
    if layout == "task_folder":
        (tmp_path / "d" / "boolq.jsonl").mkdir(parents=True)
    with pytest.raises(SystemExit) as exit_info:
        prefetch.main(["--tasks", "boolq", "--jsonl-dir", str(folder), *(["--list"] if layout == "with_list" else [])])
    assert exit_info.value.code == 2 and message in capsys.readouterr().err
