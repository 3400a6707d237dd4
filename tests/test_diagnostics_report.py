"""scripts/analyze.py on DCP checkpoints of tiny models (Parallax vs Transformer)."""

from __future__ import annotations

import os

import pytest
import torch
from torch.distributed.checkpoint.state_dict import get_model_state_dict

from parallax_titan.checkpointing import save_checksummed
from matplotlib.figure import Figure

from parallax_titan.diagnostics.report import (
    load_checkpoint_model, match_checkpoint, report_owned, result_to_json, write_report)
from parallax_titan.diagnostics.runner import DiagnosticsResult
from eval.checkpoint import load_job_config as load_config
from scripts.analyze import main
from tests._output_folders import refused_output

BASE_CONFIG = "configs/test_cpu_2rank.toml"
SMALL = "\n[model]\ndim = 64\nn_heads = 4\nn_kv_heads = 2\nhead_dim = 16\nhidden_dim = 96\n"


@pytest.fixture(scope="module", autouse=True)
def small_config(tmp_path_factory):
    """The 2-rank test config with a narrower model (keeps the test fast)."""
    global CONFIG
    text = open(BASE_CONFIG).read().replace("[model]\n", "[model]\n" + SMALL.split("[model]\n")[1], 1)
    CONFIG = str(tmp_path_factory.mktemp("config") / "small.toml")
    with open(CONFIG, "w") as f:
        f.write(text)


def save_checkpoint(path: str, name: str, seed: int) -> torch.nn.Module:
    """A checkpoint laid out as the trainer's (flattened model keys, a checksum manifest), of the config's model."""
    job = load_config(CONFIG)
    job.model.name = name
    os.makedirs(path, exist_ok=True)
    save_checksummed(get_model_state_dict(_random_model(job, seed)), path)
    return job


def _random_model(job, seed):
    import copy

    from torchtitan.protocols.train_spec import get_train_spec

    from parallax_titan.spec import register_all

    register_all()
    spec = get_train_spec(job.model.name)
    args = copy.deepcopy(spec.model_args[job.model.flavor])
    args.update_from_config(job)
    torch.manual_seed(seed)
    model = spec.model_cls(args)
    with torch.no_grad():
        model.init_weights()
    return model


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    root = tmp_path_factory.mktemp("ckpt")
    save_checkpoint(str(root / "parallax"), "parallax", 1)
    save_checkpoint(str(root / "transformer"), "transformer", 2)
    return str(root / "parallax"), str(root / "transformer")


def test_loaded_model_has_the_checkpoint_weights(checkpoints):
    job = load_config(CONFIG)
    model = load_checkpoint_model(job, checkpoints[0])
    reference = _random_model(job, 1)
    for (name, p), q in zip(model.state_dict().items(), reference.state_dict().values()):
        assert torch.equal(p, q), name
    transformer = load_checkpoint_model(job, checkpoints[1])  # mixer read from the checkpoint
    assert transformer.model_args.mixer == "softmax" and job.model.name == "parallax"


def test_report_compares_parallax_and_transformer(checkpoints, tmp_path):
    out = str(tmp_path / "report")
    report = main(["--config", CONFIG, "--checkpoint", checkpoints[0], "--compare", checkpoints[1],
                   "--labels", "parallax", "transformer", "--out", out, "--seq-len", "32", "--max-queries", "4"])
    text = open(report).read()
    for figure in ("probe_collapse.png", "scores_sinks.png", "spectra.png", "cka.png", "stable_rank_depth.png"):
        assert f"({figure})" in text and os.path.getsize(os.path.join(out, figure)) > 10_000
    per_head_stable_rank = [line for line in text.splitlines() if line.startswith(("| parallax |", "| transformer |"))][2:4]
    assert per_head_stable_rank[0].count("–") == 0
    assert per_head_stable_rank[1].count("–") == 2  # no W_R and W_RK in a Transformer
    assert os.path.isfile(os.path.join(out, "results.json"))


def test_bad_checkpoint_is_rejected(tmp_path, checkpoints):
    with pytest.raises(ValueError, match="--checkpoint .* has no DCP .metadata file"):
        load_checkpoint_model(load_config(CONFIG), str(tmp_path))
    job = load_config(CONFIG)
    job.model.n_layers = 3
    with pytest.raises(ValueError, match=r"holds another model than parallax/debug: layers.2.\S+: checkpoint absent"):
        load_checkpoint_model(job, checkpoints[0])


def test_load_errors_name_the_option_that_gave_the_checkpoint(tmp_path, checkpoints):
    """A --compare checkpoint of another model was reported as --checkpoint's."""
    job = load_config(CONFIG)
    job.model.n_layers = 3
    with pytest.raises(ValueError, match=r"^--compare .* holds another model than parallax/debug"):
        load_checkpoint_model(job, checkpoints[0], who="--compare")
    with pytest.raises(ValueError, match=r"^--compare .* has no DCP .metadata file"):
        load_checkpoint_model(load_config(CONFIG), str(tmp_path), who="--compare")


def test_gate_is_read_from_the_checkpoint():
    job = load_config(CONFIG)
    keys = {"layers.0.attention.wr.weight": (64, 64), "layers.0.attention.gate.weight": (4, 64)}
    match_checkpoint(job, keys)
    assert job.parallax.gate == "head" and job.model.name == "parallax"


@pytest.fixture
def no_loading(monkeypatch):
    """scripts.analyze with checksum checks recorded and model loads that fail the test when reached."""
    import scripts.analyze as analyze

    calls = []
    monkeypatch.setattr(analyze, "verify_before_load", lambda *args, **kwargs: calls.append("verify"))

    def load(*args, **kwargs):
        raise AssertionError("a checkpoint was loaded before the arguments were checked")

    monkeypatch.setattr(analyze, "load_checkpoint_model", load)
    return calls


@pytest.mark.parametrize("layout", ["file", "foreign", "under_file"])
def test_out_that_is_not_a_report_folder_is_refused_before_any_checkpoint(tmp_path, capsys, no_loading, layout):
    """--out was written after every checkpoint was analysed: a file there failed with a traceback at
    the very end, and a folder of the user's got report.md (and the rest) written over its files."""
    out = refused_output(tmp_path, layout, "report.md", "the user's own report")
    with pytest.raises(SystemExit) as exit_info:
        main(["--config", CONFIG, "--checkpoint", str(tmp_path / "ckpt"), "--out", str(out)])
    assert exit_info.value.code == 2 and no_loading == []
    err = capsys.readouterr().err
    assert "--out" in err and str(out) in err
    if layout == "foreign":
        assert "notes.txt" in err and (out / "report.md").read_text() == "the user's own report"


def test_empty_out_is_refused_before_any_checkpoint(tmp_path, capsys, no_loading):
    """--out "" (an unset shell variable) passed the folder check: the report's makedirs failed with a
    traceback after every checkpoint was hashed, loaded and analysed."""
    with pytest.raises(SystemExit) as exit_info:
        main(["--config", CONFIG, "--checkpoint", str(tmp_path / "ckpt"), "--out", ""])
    assert exit_info.value.code == 2 and no_loading == []
    assert "--out: got ''" in capsys.readouterr().err


def test_out_of_an_earlier_report_is_accepted(tmp_path, checkpoints):
    out = tmp_path / "report"
    args = ["--config", CONFIG, "--checkpoint", checkpoints[0], "--out", str(out), "--seq-len", "16",
            "--max-queries", "2"]
    main(args)
    assert os.path.isfile(main(args))  # rerun into its own output


@pytest.mark.parametrize("extra", [["--compare", "B", "--labels", "a", "a"], ["--compare", "A"]])
def test_labels_of_two_checkpoints_must_differ(tmp_path, capsys, no_loading, extra):
    """Two runs of one label were one entry of the report: the first run's results were dropped
    without a word (``--checkpoint X --compare X`` gives the same default label twice)."""
    with pytest.raises(SystemExit) as exit_info:
        main(["--config", CONFIG, "--checkpoint", "A", *extra, "--out", str(tmp_path / "out")])
    assert exit_info.value.code == 2 and no_loading == []
    assert "--labels" in capsys.readouterr().err


def test_repeated_list_flags_add_up(tmp_path):
    """A second --compare (or --labels, --compare-config) replaced the first: its checkpoints were
    dropped from the report without a word."""
    from scripts.analyze import parse_args

    args = parse_args(["--config", CONFIG, "--checkpoint", "run/a", "--compare", "run/b", "--compare", "run/c", "run/d",
                       "--labels", "a", "b", "--labels", "c", "d", "--compare-config", CONFIG,
                       "--compare-config", CONFIG, CONFIG, "--out", str(tmp_path / "out")])
    assert args.compare == ["run/b", "run/c", "run/d"] and args.labels == ["a", "b", "c", "d"]
    assert args.compare_config == [CONFIG] * 3


@pytest.mark.parametrize("verify", [[], ["--no-verify"]])
@pytest.mark.parametrize("compare", ["missing", "parent"])
def test_compare_that_is_no_checkpoint_is_refused_before_any_work(tmp_path, checkpoints, no_loading, verify,
                                                                  compare):
    """A --compare path that is no checkpoint (a typo, the checkpoint/ folder above the steps) was
    found when its turn to load came, after the checkpoints before it were loaded and analysed, and
    was reported as --checkpoint."""
    path = str(tmp_path / "missing") if compare == "missing" else os.path.dirname(checkpoints[1])
    with pytest.raises(ValueError, match=rf"^--compare '{path}' (is not a directory|has no DCP .metadata file)"):
        main(["--config", CONFIG, "--checkpoint", checkpoints[0], "--compare", path, "--out", str(tmp_path / "out"),
              *verify])
    assert no_loading == []  # not even a checksum was read


def test_compare_config_without_compare_is_refused(tmp_path, capsys, no_loading):
    """It was ignored: the report analysed --checkpoint with --config, not with the config given."""
    with pytest.raises(SystemExit) as exit_info:
        main(["--config", CONFIG, "--checkpoint", "A", "--compare-config", CONFIG, "--out", str(tmp_path / "out")])
    assert exit_info.value.code == 2 and no_loading == []
    assert "--compare-config" in capsys.readouterr().err


@pytest.mark.parametrize("flag, key", [("--batch-size", "batch_size"), ("--max-queries", "max_queries")])
def test_bad_settings_are_refused_before_the_checksums_are_read(tmp_path, no_loading, flag, key):
    """The settings were checked after every checkpoint's files were hashed (minutes for large ones)."""
    with pytest.raises(ValueError, match=rf"diagnostics.{key}: expected >= 1, got 0"):
        main(["--config", CONFIG, "--checkpoint", "A", flag, "0", "--out", str(tmp_path / "out")])
    assert no_loading == []


def two_layer_result() -> DiagnosticsResult:
    """A small hand-made result with every part the report draws."""
    return DiagnosticsResult(
        attention={0: {"cor": 1.0, "entropy": 1.2}, 1: {"cor": 2.0, "entropy": 0.8}},
        spectral={i: {"W_QK": {"stable_rank": 2.0, "erank": 3.0, "energy_erank": 2.5}, "cka": {"v_fixed": 0.4}}
                  for i in (0, 1)},
        spectra={i: {"W_QK": torch.tensor([1.0, 0.5, 0.1], dtype=torch.float64)} for i in (0, 1)},
        cost={"attention_s": 0.1, "spectral_s": 0.2, "total_s": 0.3})


def test_a_failed_rewrite_leaves_the_earlier_report_whole(tmp_path, monkeypatch):
    """Each file was opened over the earlier report's: a write that failed part-way (a full disk, a
    kill, a value JSON cannot hold) left a truncated PNG or an empty results.json in its place."""
    out = str(tmp_path / "report")
    write_report({"a": two_layer_result()}, {"a": ("ckpt", "parallax")}, out, {}, "analyze")
    earlier = {name: (tmp_path / "report" / name).read_bytes() for name in os.listdir(out)}

    def disk_full(self, fname, *args, **kwargs):
        with open(fname, "wb") as f:
            f.write(b"\x89PNG")
        raise OSError("No space left on device")

    with monkeypatch.context() as patch:
        patch.setattr(Figure, "savefig", disk_full)
        with pytest.raises(OSError, match="No space"):
            write_report({"a": two_layer_result()}, {"a": ("ckpt", "parallax")}, out, {}, "analyze")
    assert {name: (tmp_path / "report" / name).read_bytes() for name in os.listdir(out)} == earlier
    unserialisable = two_layer_result()
    unserialisable.cost["attention_s"] = torch.tensor(0.1)
    with pytest.raises(TypeError):
        write_report({"a": unserialisable}, {"a": ("ckpt", "parallax")}, out, {}, "analyze")
    assert sorted(os.listdir(out)) == sorted(earlier)
    for name in ("results.json", "report.md"):
        assert (tmp_path / "report" / name).read_bytes() == earlier[name], name


def test_temporary_files_of_a_killed_report_do_not_block_a_rerun():
    assert report_owned(".report.md.partial-4242") and report_owned(".cka.png.partial-7")
    assert not report_owned(".report.md") and not report_owned(".notes.txt.partial-7")
    assert not report_owned(".report.md.partial-x") and not report_owned("report.md.partial-7")


@pytest.mark.parametrize("change, message", [
    (("seq_len = 32", "seq_len = 16"), r"training.seq_len = 16 \(the model's RoPE table\) is shorter than the "
                                       r"held-out rows of 32 tokens; expected at least 32, or pass --seq-len 16"),
    (("hf_assets_path = \"./parallax_titan/assets/tokenizer/tiny\"", "hf_assets_path = \"{other}\""),
     r"model.hf_assets_path = '.*other' holds another tokenizer than --config's"),
])
def test_compare_config_that_cannot_read_the_heldout_batch_is_refused(tmp_path, no_loading, change, message):
    """A --compare-config with a shorter training.seq_len failed with a bare AssertionError inside
    TorchTitan's RoPE, after every checkpoint was hashed; one with another tokenizer was never
    consulted: its model read token ids of --config's tokenizer as its own."""
    other = tmp_path / "other"
    other.mkdir()
    tokenizer = open("parallax_titan/assets/tokenizer/tiny/tokenizer.json").read()  # another decoder setting
    (other / "tokenizer.json").write_text(tokenizer.replace('"add_prefix_space": true', '"add_prefix_space": false', 1))
    (other / "tokenizer_config.json").write_text(open("parallax_titan/assets/tokenizer/tiny/tokenizer_config.json").read())
    old, new = change
    text = open(CONFIG).read()
    assert old in text
    compare = tmp_path / "compare.toml"
    compare.write_text(text.replace(old, new.format(other=other)))
    with pytest.raises(ValueError, match=rf"--compare-config '{compare}': {message}"):
        main(["--config", CONFIG, "--checkpoint", "A", "--compare", "B", "--compare-config", str(compare),
              "--out", str(tmp_path / "out")])
    assert no_loading == []


def test_compare_config_with_a_copy_of_the_tokenizer_is_accepted(tmp_path, checkpoints):
    other = tmp_path / "copy"
    other.mkdir()
    for name in ("tokenizer.json", "tokenizer_config.json"):
        (other / name).write_text(open(f"parallax_titan/assets/tokenizer/tiny/{name}").read())
    compare = tmp_path / "compare.toml"
    compare.write_text(open(CONFIG).read().replace("./parallax_titan/assets/tokenizer/tiny", str(other)))
    report = main(["--config", CONFIG, "--checkpoint", checkpoints[0], "--compare", checkpoints[1],
                   "--compare-config", str(compare), "--out", str(tmp_path / "out"), "--seq-len", "16",
                   "--max-queries", "2"])
    assert os.path.isfile(report)


def test_results_json_holds_null_for_metrics_that_are_not_finite():
    """The spectra of a zero W_R (up-training's start) are NaN: Python wrote bare NaN, which strict
    JSON readers refuse; now null, the finite values unchanged."""
    import json

    result = DiagnosticsResult(attention={0: {"cor": 0.5, "cpa": float("nan")}},
                               spectral={0: {"W_R": {"stable_rank": float("nan"), "erank": float("inf")}}},
                               spectra={0: {"W_R": torch.tensor([1.0, float("nan")], dtype=torch.float64)}},
                               cost={"attention": 0.25})
    text = json.dumps(result_to_json(result), allow_nan=False)
    back = json.loads(text)
    assert back["attention"]["0"] == {"cor": 0.5, "cpa": None}
    assert back["spectral"]["0"]["W_R"] == {"stable_rank": None, "erank": None}
    assert back["spectra"]["0"]["W_R"] == [1.0, None] and back["cost"] == {"attention": 0.25}


def test_a_heldout_batch_longer_than_its_dataset_is_refused_before_the_checksums_are_read(tmp_path, checkpoints,
                                                                                          no_loading):
    """The held-out batch was read after every checkpoint's files were hashed (minutes for large ones):
    a --batch-size that the dataset cannot fill failed only then."""
    with pytest.raises(ValueError, match=r"has only \d+ tokens; the held-out batch needs diagnostics.batch_size "
                                         r"\* seq_len = 100000 \* 32"):
        main(["--config", CONFIG, "--checkpoint", checkpoints[0], "--batch-size", "100000", "--out",
              str(tmp_path / "out")])
    assert no_loading == []
