"""DCP checkpoint folders: complete steps, the step to load, saved shapes, two-way weight comparison."""

from __future__ import annotations

import os

import pytest
import torch
import torch.distributed.checkpoint as dcp

from parallax_titan.checkpoint_files import (
    Mismatch,
    complete_steps,
    describe,
    saved_shapes,
    step_to_load,
    weight_mismatches,
)


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
