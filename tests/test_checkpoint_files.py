"""DCP checkpoint folders: complete steps, the step to load, saved shapes, two-way weight comparison."""

from __future__ import annotations

import os

import pytest
import torch
import torch.distributed.checkpoint as dcp

from parallax_titan.checkpoint_files import (
    CheckpointError,
    Mismatch,
    choose_step,
    complete_steps,
    describe,
    quick_problem,
    saved_shapes,
    step_to_load,
    weight_mismatches,
)
from parallax_titan.checksums import digest_files, write_manifest


def save(path, state: dict) -> str:
    dcp.save(state, checkpoint_id=str(path), no_dist=True)
    return str(path)


@pytest.fixture
def folder(tmp_path):
    """step-1 and step-3 complete, step-5 interrupted (no .metadata), plus names that are no steps."""
    for step in (1, 3):
        save(tmp_path / f"step-{step}", {"w": torch.zeros(2, 3)})
    (tmp_path / "step-5").mkdir()
    (tmp_path / "step-5" / "__0_0.distcp").write_bytes(b"partial")
    (tmp_path / "step-x").mkdir()
    (tmp_path / "step-7.old").mkdir()
    (tmp_path / "notes.txt").write_text("not a checkpoint")
    return str(tmp_path)


def test_complete_steps(folder, tmp_path):
    assert complete_steps(folder) == [1, 3]
    assert complete_steps(str(tmp_path / "absent")) == []


def test_a_step_folder_with_leading_zeros_is_named_not_skipped(folder):
    """step-02 would be listed as step 2 and then looked for as step-2 (by TorchTitan too)."""
    save(os.path.join(folder, "step-02"), {"w": torch.zeros(2, 3)})
    for call in (complete_steps, step_to_load):
        with pytest.raises(ValueError, match=r"'.*step-02': a checkpoint step folder named with leading zeros, which "
                                             r"is read as step 2 at '.*step-2' and not found; expected it renamed to step-2"):
            call(folder)
    os.rename(os.path.join(folder, "step-02"), os.path.join(folder, "step-2"))
    assert complete_steps(folder) == [1, 2, 3]


def test_step_to_load(folder, tmp_path):
    assert step_to_load(folder) == 3
    assert step_to_load(folder, 1) == 1
    assert step_to_load(str(tmp_path / "absent")) is None
    with pytest.raises(ValueError, match=r"step 5: '.*step-5' has no \.metadata .*complete steps in '.*': 1, 3"):
        step_to_load(folder, 5)
    with pytest.raises(ValueError, match=r"step 4: '.*step-4' does not exist; complete steps in '.*': 1, 3"):
        step_to_load(folder, 4)
    with pytest.raises(ValueError, match="does not exist; complete steps in .*: none"):
        step_to_load(str(tmp_path / "absent"), 0)


def test_saved_shapes_lists_tensors_only(tmp_path):
    path = save(tmp_path / "ckpt", {"a": torch.zeros(4, 5), "b": {"c": torch.zeros(7, dtype=torch.bfloat16)},
                                    "train_state": {"step": 3}})
    assert saved_shapes(path) == {"a": (4, 5), "b.c": (7,)}


def test_saved_shapes_errors_name_the_path(folder, tmp_path):
    with pytest.raises(ValueError, match=r"'.*absent' is not a directory"):
        saved_shapes(str(tmp_path / "absent"))
    with pytest.raises(ValueError, match=r"'.*step-5' has no DCP \.metadata file"):
        saved_shapes(os.path.join(folder, "step-5"))
    with pytest.raises(ValueError, match="it holds checkpoints step-1, step-3: pass one of them"):
        saved_shapes(folder)
    with open(os.path.join(folder, "step-3", ".metadata"), "wb") as f:
        f.write(b"\x80\x04 not a pickle")
    with pytest.raises(ValueError, match=r"'.*step-3': cannot read its DCP metadata"):
        saved_shapes(os.path.join(folder, "step-3"))


def test_weight_mismatches_both_ways_ignoring_training_states():
    saved = {"tok.weight": (8, 4), "b.weight": (4,), "c.weight": (1,), "optimizer.state.x.exp_avg": (9,),
             "lr_scheduler.x": (1,), "dataloader.x": (1,), "train_state.y": (1,)}
    expected = {"tok.weight": (8, 4), "b.weight": (5,), "d.weight": (7,)}
    found = weight_mismatches(saved, expected)
    assert found == [Mismatch("b.weight", (4,), (5,)), Mismatch("d.weight", None, (7,)),
                     Mismatch("c.weight", (1,), None)]
    assert describe(found) == "b.weight: checkpoint (4,), model (5,) (3 weights differ)"
    assert describe([Mismatch("c.weight", (1,), None)]) == "c.weight: checkpoint (1,), model absent"
    assert weight_mismatches(saved, {"tok.weight": (8, 4), "b.weight": (4,), "c.weight": (1,)}) == []


def test_newest_step_in_hugging_face_format_cannot_be_resumed(folder):
    """TorchTitan resumes from the newest step folder with .metadata or a safetensors index."""
    os.makedirs(os.path.join(folder, "step-2"))
    open(os.path.join(folder, "step-2", "model.safetensors.index.json"), "w").close()
    assert step_to_load(folder) == 3  # an older Hugging Face save is never picked
    os.makedirs(os.path.join(folder, "step-7"))
    open(os.path.join(folder, "step-7", "model.safetensors.index.json"), "w").close()
    with pytest.raises(ValueError, match=r"step 7: '.*step-7' is a Hugging Face save .*complete DCP step \(1, 3\)"):
        step_to_load(folder)
    assert step_to_load(folder, 3) == 3


def test_choose_step_goes_back_over_invalid_steps(folder):
    problems = {3: "step-3 is damaged"}
    problem_of = problems.get
    assert choose_step(folder, -1, problem_of, stop_on_corrupt=False) == (1, [(3, "step-3 is damaged")])
    assert choose_step(folder, -1, lambda step: None, stop_on_corrupt=True) == (3, [])
    with pytest.raises(CheckpointError, match=r"checkpoint '.*step-3' is not valid: step-3 is damaged; not loaded "
                                              r"\(checkpoint.on_corrupt = 'stop'\)"):
        choose_step(folder, -1, problem_of, stop_on_corrupt=True)


def test_choose_step_has_no_fallback_for_an_explicit_step(folder):
    assert choose_step(folder, 1, {3: "bad"}.get, stop_on_corrupt=False) == (1, [])
    with pytest.raises(CheckpointError, match=r"step-3' is not valid: bad; not loaded \(checkpoint.load_step names"):
        choose_step(folder, 3, {3: "bad"}.get, stop_on_corrupt=False)
    with pytest.raises(ValueError, match="step 5: .* has no .metadata"):
        choose_step(folder, 5, {}.get, stop_on_corrupt=False)


def test_choose_step_with_nothing_valid_or_nothing_at_all(folder, tmp_path):
    with pytest.raises(CheckpointError, match=r"no valid checkpoint in '.*': step 3: a; step 1: b; move the folder"):
        choose_step(folder, -1, {3: "a", 1: "b"}.get, stop_on_corrupt=False)
    assert choose_step(str(tmp_path / "absent"), -1, {}.get, stop_on_corrupt=False) == (None, [])


def test_quick_problem_reads_no_tensor_file(tmp_path):
    """A manifest, sizes and the small files are checked; a changed byte inside a large file is
    left to the full check at load time."""
    path = save(tmp_path / "step-1", {"w": torch.arange(6.0)})
    assert "manifest.json' does not exist" in quick_problem(path)
    write_manifest(path, digest_files(path, os.listdir(path), 1, "blake2b_128"), "blake2b_128")
    assert quick_problem(path) is None
    data = os.path.join(path, "__0_0.distcp")
    with open(data, "r+b") as f:
        f.write(b"\xff")
    assert quick_problem(path) is None
    with open(data, "ab") as f:
        f.write(b"\0")
    assert quick_problem(path).startswith(f"{data}: ")
    with open(os.path.join(path, ".metadata"), "r+b") as f:
        f.write(b"\xff")
    os.truncate(data, os.path.getsize(data) - 1)
    assert quick_problem(path) == (f"{os.path.join(path, '.metadata')}: bytes 0-{os.path.getsize(path + '/.metadata')} "
                                   "differ from their blake2b_128 checksum in manifest.json (corrupted)")
