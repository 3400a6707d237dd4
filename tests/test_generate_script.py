"""python -m scripts.generate on a DCP checkpoint: streamed greedy text equals recomputing per
token, stop strings, seeds, errors named."""

from __future__ import annotations

import io
import os

import pytest
import torch

from eval.checkpoint import build_model, load_job_config, model_args_of
from parallax_titan.checkpointing import save_checksummed
from parallax_titan.tokenizer import build_tokenizer
from scripts import generate as script
from tests._generation_models import recompute_greedy

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CONFIG = os.path.join(REPO, "configs", "test_cpu_2rank.toml")  # parallax, debug size, 2 layers, seq_len 32
PROMPT = "Once upon a time"


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    job_config = load_job_config(CONFIG)
    torch.manual_seed(0)
    model = build_model(model_args_of(job_config), torch.device("cpu"))
    folder = str(tmp_path_factory.mktemp("ckpt") / "step-1")
    save_checksummed(model.state_dict(), folder)
    return folder, model, build_tokenizer(job_config)


def run(folder, *extra):
    args, overrides = script.build_parser().parse_known_args(
        ["--config", CONFIG, "--checkpoint", folder, "--device", "cpu", *extra])
    out = io.StringIO()
    texts = script.run(args, overrides, out=out)
    return out.getvalue(), texts


def test_greedy_text_streams_and_equals_recomputing(checkpoint):
    folder, model, tokenizer = checkpoint
    prompt = tokenizer.encode(PROMPT, add_bos=False, add_eos=False)
    expected = tokenizer.decode(recompute_greedy(model, prompt, 8, stop_ids=(tokenizer.eos_id,)))
    shown, texts = run(folder, "--prompt", PROMPT, "--max-new-tokens", "8")
    assert texts == [expected] and shown == PROMPT + expected + "\n"
    stop = expected[3:5]
    shown, texts = run(folder, "--prompt", PROMPT, "--prompt", "Two", "--max-new-tokens", "8", "--stop", stop)
    assert texts[0] == expected[: expected.index(stop)] and shown.startswith(PROMPT + texts[0] + "\nTwo")


def test_sampling_repeats_with_a_seed(checkpoint):
    folder, _, _ = checkpoint
    args = ["--prompt", PROMPT, "--max-new-tokens", "12", "--temperature", "1.2", "--top-p", "0.9", "--top-k", "40",
            "--repetition-penalty", "1.2"]
    assert run(folder, *args, "--seed", "3") == run(folder, *args, "--seed", "3")
    assert run(folder, *args, "--seed", "3") != run(folder, *args, "--seed", "4")


def test_errors_name_the_argument(checkpoint, capsys):
    folder, _, _ = checkpoint
    base = ["--config", CONFIG, "--checkpoint", folder, "--device", "cpu", "--prompt", PROMPT]
    assert script.main([*base, "--temperature", "-1"]) == 2
    assert "temperature: expected" in capsys.readouterr().err
    assert script.main([*base, "--max-new-tokens", "40"]) == 2
    assert "--max-length" in capsys.readouterr().err
    shown, _ = run(folder, "--prompt", PROMPT, "--max-new-tokens", "40", "--max-length", "64")
    assert shown.startswith(PROMPT)


@pytest.fixture
def no_loading(monkeypatch):
    def load(*args, **kwargs):
        raise AssertionError("the checkpoint was read before the arguments were checked")

    monkeypatch.setattr(script, "load_model", load)


@pytest.mark.parametrize("device", ["gpu", "cuda:x", "meta"] + ([] if torch.cuda.is_available() else ["cuda"])
                         + [f"cuda:{torch.cuda.device_count()}"])
def test_unusable_device_is_refused_before_the_checkpoint(checkpoint, capsys, no_loading, device):
    """--device gpu was a traceback from torch.device; --device cuda on a machine without one was a
    traceback after the checkpoint's files were hashed."""
    folder, _, _ = checkpoint
    assert script.main(["--config", CONFIG, "--checkpoint", folder, "--device", device, "--prompt", PROMPT]) == 2
    err = capsys.readouterr().err
    assert f"--device: got {device!r}" in err and "Traceback" not in err


def test_empty_stop_string_is_refused(checkpoint, capsys, no_loading):
    """--stop "" (an unset shell variable) was dropped without a word: generation ran to the length limit."""
    folder, _, _ = checkpoint
    assert script.main(["--config", CONFIG, "--checkpoint", folder, "--device", "cpu", "--prompt", PROMPT,
                        "--stop", "\n", "--stop", ""]) == 2
    assert "--stop: got ''" in capsys.readouterr().err


def test_main_writes_to_the_current_stdout(checkpoint):
    """run()'s output defaulted to the sys.stdout of import time: main() under redirect_stdout (or a
    test's capture) wrote the text past the redirection."""
    import contextlib

    folder, _, _ = checkpoint
    expected, _ = run(folder, "--prompt", PROMPT, "--max-new-tokens", "3")
    shown = io.StringIO()
    with contextlib.redirect_stdout(shown):
        assert script.main(["--config", CONFIG, "--checkpoint", folder, "--device", "cpu", "--prompt", PROMPT,
                            "--max-new-tokens", "3"]) == 0
    assert shown.getvalue() == expected
