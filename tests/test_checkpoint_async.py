"""Background saves (``checkpoint.async_mode = "async"``) are as safe as synchronous ones: each is
written into ``.partial-N`` and becomes ``step-N`` with settings.json and a manifest only once its
write has finished; a resume from one is exact and its resume rules hold; a write that fails in the
background stops the run at the next save naming the step, and leaves no step folder.

Three short ``train.py`` runs (a straight one, one stopped at step 3, its rerun) and a few cases on a
ParallaxCheckpointManager of a one-layer model in this process (one-rank gloo group), where a
stand-in for DCP's file writer blocks or fails inside the background save."""

from __future__ import annotations

import contextlib
import os
import shutil
import threading

import pytest
import torch
import torch.distributed as dist
from torch.distributed.checkpoint import FileSystemWriter

from parallax_titan import checkpointing
from parallax_titan.checkpoint_files import (
    CheckpointError, choose_step, complete_steps, folder_problem, step_dir, step_to_load)
from parallax_titan.checkpointing import ParallaxCheckpointManager
from parallax_titan.checksums import MANIFEST_FILE, read_manifest
from parallax_titan.config.sections import Checkpoint
from parallax_titan.resume_rules import read_settings
from scripts.bench.checkpoint import StepCounter
from tests._train_runs import losses, run_single, train

ASYNC = ["--training.dataset", "default_corpus", "--training.steps", "4", "--checkpoint.interval", "1",
         "--checkpoint.async_mode", "async", "--checkpoint.keep_latest_k", "2"]
"""Steps 1-3 saved in the background, step 4 (the last) synchronously; two complete steps kept."""


def output(result) -> str:
    return result.stdout + result.stderr


# ---- through train.py ---------------------------------------------------------------------------

@pytest.fixture(scope="module")
def straight(tmp_path_factory):
    dump = tmp_path_factory.mktemp("straight")
    return dump, output(train(dump, *ASYNC))


@pytest.fixture(scope="module")
def stopped(tmp_path_factory):
    """The run stopped after step 3, whose background save the stop does not repeat: it is
    published before the stop says the checkpoint is saved."""
    dump = tmp_path_factory.mktemp("stopped")
    log = output(train(dump, *ASYNC, "--reliability.stop_at_step", "3"))
    published = log.index("Checkpoint step-3 complete in the background")
    assert published < log.index("Stopping after step 3 (reliability.stop_at_step = 3); checkpoint saved"), log
    return dump


@pytest.fixture
def rerun(stopped, tmp_path):
    shutil.copytree(stopped, tmp_path / "run")
    return tmp_path / "run"


def test_background_saves_are_published_with_settings_and_manifest(straight):
    dump, log = straight
    folder = dump / "checkpoint"
    assert sorted(os.listdir(folder)) == ["step-3", "step-4"]  # keep_latest_k = 2, no .partial-N left
    for step in (1, 2, 3):
        assert f"Checkpoint step-{step} complete in the background (checkpoint.async_mode = 'async')" in log
    assert "Deleting checkpoint step-1" in log and "Deleting checkpoint step-2" in log
    for step in (3, 4):  # step 3 saved in the background, step 4 synchronously
        path = str(folder / f"step-{step}")
        assert set(read_manifest(path).files) == {".metadata", "settings.json", "__0_0.distcp"}
        assert folder_problem(path) is None
        assert read_settings(path)["training.steps"] == 4


def test_resume_from_a_background_save_is_exact(straight, stopped, rerun):
    assert sorted(os.listdir(stopped / "checkpoint")) == ["step-2", "step-3"]
    assert sorted(losses(stopped)) == [1, 2, 3]
    log = output(train(rerun, *ASYNC))
    assert "Training starts at step 4" in log
    assert "has no settings.json" not in log  # the resume rules compared the checkpoint's settings
    assert losses(rerun) == losses(straight[0])  # bit-exact


def test_resume_rules_hold_for_a_background_save(rerun):
    result = run_single(rerun, *ASYNC, "--training.seq_len", "64")
    assert result.returncode == 2, output(result)[-3000:]
    assert (f"training.seq_len: the checkpoint '{rerun / 'checkpoint' / 'step-3'}' was trained with 32 and this run "
            "sets 64; refused on resume") in result.stderr
    assert "Training starts" not in output(result)


@pytest.mark.slow  # three 2-rank torchrun jobs, about 1.5 minutes
def test_background_saves_of_two_ranks_publish_both_shards_and_resume_exactly(tmp_path):
    """Rank 0 publishes alone what both ranks wrote: its manifest lists both ranks' files, and a
    2-rank resume from a background save repeats the straight run's losses."""
    straight2, stopped2 = tmp_path / "straight", tmp_path / "stopped"
    log = output(train(straight2, *ASYNC, nproc=2))
    assert "Checkpoint step-3 complete in the background" in log
    path = str(straight2 / "checkpoint" / "step-3")
    assert set(read_manifest(path).files) == {".metadata", "settings.json", "__0_0.distcp", "__1_0.distcp"}
    assert folder_problem(path) is None and sorted(os.listdir(straight2 / "checkpoint")) == ["step-3", "step-4"]
    train(stopped2, *ASYNC, "--reliability.stop_at_step", "3", nproc=2)
    train(stopped2, *ASYNC, nproc=2)
    assert losses(stopped2) == losses(straight2)


# ---- a manager in this process ------------------------------------------------------------------

class Saves:
    """Managers saving into one folder of a one-process gloo group (TorchTitan's background saves
    build a gloo group of their own), and stand-ins for DCP's file writer that hold a background
    save; all released and closed when the test ends, before the group goes."""

    def __init__(self, dump, monkeypatch) -> None:
        self.dump, self.monkeypatch = dump, monkeypatch
        self.folder = dump / "checkpoint"
        self.managers: list[ParallaxCheckpointManager] = []
        self.release = threading.Event()

    def manager(self, async_mode: str = "async") -> ParallaxCheckpointManager:
        """A manager saving a 4x4 linear layer (and stand-in training states) at every step."""
        config = Checkpoint(enable=True, interval=1, async_mode=async_mode, keep_latest_k=0)
        mgr = ParallaxCheckpointManager(
            dataloader=StepCounter(), model_parts=[torch.nn.Linear(4, 4)], optimizers=StepCounter(),
            lr_schedulers=StepCounter(), states={"train_state": StepCounter()}, checkpoint_config=config,
            sd_adapter=None, base_folder=str(self.dump))
        mgr.settings = {"optimizer.lr": 0.01}
        self.managers.append(mgr)
        return mgr

    def hold(self, error: BaseException | None = None) -> threading.Event:
        """From now on DCP's file writer, after writing ``.metadata`` (the last file of a save, in the
        background thread), waits for :attr:`release` and then raises ``error`` (None: returns).
        Returns an event set once a save has reached that point."""
        reached, finish, release = threading.Event(), FileSystemWriter.finish, self.release

        def finish_then_wait(writer, *args, **kwargs):
            finish(writer, *args, **kwargs)
            reached.set()
            assert release.wait(20), "the test never released the save"
            if error is not None:
                raise error

        self.monkeypatch.setattr(FileSystemWriter, "finish", finish_then_wait)
        return reached

    def close(self) -> None:
        self.release.set()
        for mgr in self.managers:
            with contextlib.suppress(CheckpointError):
                mgr.close()


@pytest.fixture
def saves(tmp_path, monkeypatch):
    dist.init_process_group("gloo", init_method=f"file://{tmp_path}/store", rank=0, world_size=1)
    saves = Saves(tmp_path, monkeypatch)
    yield saves
    saves.close()
    dist.destroy_process_group()


def _raise(error: BaseException):
    def fail(*args, **kwargs):
        raise error
    return fail


FAILURES = {
    "write": "OSError on rank 0: [Errno 28] No space left on device",  # inside DCP's write
    "publish": "OSError: [Errno 30] Read-only file system",  # rank 0's publication, after the write
}


@pytest.mark.parametrize("where", sorted(FAILURES))
@pytest.mark.parametrize("noticed_by", ["next save", "close"])
def test_failed_background_save_raises_naming_the_step_and_keeps_no_folder(saves, monkeypatch, where, noticed_by):
    mgr, folder = saves.manager(), saves.folder
    mgr.save(curr_step=1)
    mgr._async_wait()  # step 1 written before the stand-in below is in place
    if where == "write":
        reached = saves.hold(OSError(28, "No space left on device"))
    else:
        reached = saves.hold()
        monkeypatch.setattr(checkpointing, "write_settings", _raise(OSError(30, "Read-only file system")))
    mgr.save(curr_step=2)  # waits for step 1 (published), starts step 2: no error yet
    assert reached.wait(20) and sorted(os.listdir(folder)) == [".partial-2", "step-1"]
    saves.release.set()
    with pytest.raises(CheckpointError) as info:
        mgr.save(curr_step=3) if noticed_by == "next save" else mgr.close()
    message = str(info.value)
    assert message.startswith(f"saving checkpoint step 2 to '{folder / 'step-2'}' in the background "
                              f"(checkpoint.async_mode = 'async') failed ({FAILURES[where]})"), message
    assert message.endswith("nothing of it was kept, and the newest complete checkpoint is step-1"), message
    assert sorted(os.listdir(folder)) == ["step-1"] and folder_problem(str(folder / "step-1")) is None
    mgr._async_wait()  # the failure was reported once; nothing is pending any more


def test_in_flight_save_is_never_loaded(saves):
    """While step 2 is written in the background, its complete-looking ``.partial-2`` (DCP's
    ``.metadata`` written, as in a run killed just before publishing) is no step for any loader;
    published, it is the newest."""
    mgr, folder = saves.manager(), str(saves.folder)
    mgr.save(curr_step=1)
    mgr._async_wait()
    reached = saves.hold()
    mgr.save(curr_step=2)
    assert reached.wait(20)
    assert sorted(os.listdir(folder)) == [".partial-2", "step-1"]
    assert os.path.isfile(os.path.join(folder, ".partial-2", ".metadata"))
    assert complete_steps(folder) == [1] and step_to_load(folder) == 1
    assert choose_step(folder, -1, lambda step: None, False) == (1, [])
    assert mgr._find_load_step() == 1  # TorchTitan's own choice
    loaded = []
    rerun = saves.manager()  # as if the run were killed now and run again
    rerun.on_loaded = lambda step, saved: loaded.append((step, saved))
    assert rerun.load() and loaded == [(1, {"optimizer.lr": 0.01})]
    saves.release.set()
    mgr._async_wait()
    assert sorted(os.listdir(folder)) == ["step-1", "step-2"] and MANIFEST_FILE in os.listdir(step_dir(folder, 2))
    assert complete_steps(folder) == [1, 2] and folder_problem(step_dir(folder, 2)) is None


def test_close_waits_until_the_background_save_is_published(saves):
    """A run that stops right after a background save (``reliability.stop_at_step`` at its step, which
    the stop does not save again) closes its manager last: the step must be published by then."""
    mgr = saves.manager()
    reached = saves.hold()
    mgr.save(curr_step=1)
    assert reached.wait(20)
    threading.Timer(0.5, saves.release.set).start()
    mgr.close()
    assert sorted(os.listdir(saves.folder)) == ["step-1"] and folder_problem(str(saves.folder / "step-1")) is None


def test_save_clears_what_a_killed_save_left(saves):
    stale = saves.folder / ".partial-1"
    stale.mkdir(parents=True)
    (stale / "__7_0.distcp").write_bytes(b"from a killed save")
    mgr = saves.manager()
    mgr.save(curr_step=1)
    mgr._async_wait()
    path = str(saves.folder / "step-1")
    assert "__7_0.distcp" not in os.listdir(path) and folder_problem(path) is None
    assert not stale.exists()


@pytest.mark.parametrize("async_mode", ["async", "disabled"])
def test_first_save_removes_every_folder_killed_saves_left(saves, async_mode, caplog):
    """``.partial-N`` of other steps (a run killed mid-save, then resumed from an earlier step)
    used to stay on disk, each as large as a checkpoint; folders that are not a save's stay."""
    for name in (".partial-7", ".partial-12", ".partial-x", "corrupt-3", "notes"):
        (saves.folder / name).mkdir(parents=True)
        (saves.folder / name / "__0_0.distcp").write_bytes(b"x" * 1000)
    mgr = saves.manager(async_mode)
    mgr.save(curr_step=1)
    mgr._async_wait()
    assert sorted(os.listdir(saves.folder)) == [".partial-x", "corrupt-3", "notes", "step-1"]
    assert f"Removing '{saves.folder / '.partial-12'}' (0.00 GiB), left by a save that did not finish" in caplog.text
    (saves.folder / ".partial-9").mkdir()  # appears during the run: not this manager's to remove
    mgr.save(curr_step=2)
    mgr._async_wait()
    assert (saves.folder / ".partial-9").exists()


@pytest.mark.skipif(torch.cuda.is_available(), reason="the machine has CUDA")
def test_pinned_memory_mode_cannot_save_without_cuda(saves):
    """Why the config refuses ``async_with_pinned_mem`` on a machine without CUDA: TorchTitan stages
    with non-blocking copies, which torch refuses without an accelerator, at the first save."""
    mgr = saves.manager("async_with_pinned_mem")
    with pytest.raises(AssertionError, match="accelerator"):
        mgr.save(curr_step=1)
    assert not os.path.exists(saves.folder / "step-1")


@pytest.mark.parametrize("cuda, version, expected", [
    (False, "2.13.0", "needs a CUDA device"),
    (True, "2.11.0", "fails at the second save with torch 2.11.0"),
    (True, "2.12.1", "fails at the second save with torch 2.12.1"),
    (True, "2.13.0", None),
])
def test_pinned_memory_mode_is_refused_where_it_cannot_save(monkeypatch, cuda, version, expected):
    """The config names the reason (``compat.pinned_memory_saves_problem``) when training loads it;
    ``async`` is accepted everywhere."""
    from torch.torch_version import TorchVersion

    from parallax_titan.config import ConfigError, load_config
    from tests.test_config_hostile import DEMO

    monkeypatch.setattr(torch.cuda, "is_available", lambda: cuda)
    monkeypatch.setattr(torch, "__version__", TorchVersion(version))
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda *a: (9, 0))
    args = ["--job.config_file", DEMO, "--checkpoint.async_mode", "async_with_pinned_mem"]
    if expected is None:
        load_config(args)
    else:
        with pytest.raises(ConfigError, match=f"checkpoint.async_mode: 'async_with_pinned_mem' {expected}"):
            load_config(args)
    load_config(args, check_data=False)  # tools that only read the config
    load_config(["--job.config_file", DEMO, "--checkpoint.async_mode", "async"])


@pytest.mark.parametrize("async_mode", ["async", "disabled"])
def test_parent_folder_that_cannot_be_synced_after_the_rename_keeps_the_step(saves, monkeypatch, async_mode, caplog):
    """The rename has made ``step-N`` complete: the save succeeds with a warning, where it used to
    fail saying that nothing of it was kept."""
    synced = checkpointing.fsync_path

    def parent_fails(path):
        if os.path.basename(path) == "checkpoint":
            raise OSError(5, "Input/output error")
        synced(path)

    monkeypatch.setattr(checkpointing, "fsync_path", parent_fails)
    mgr = saves.manager(async_mode)
    mgr.save(curr_step=1)
    mgr._async_wait()
    assert os.listdir(saves.folder) == ["step-1"] and folder_problem(str(saves.folder / "step-1")) is None
    assert "is complete, but syncing its parent folder failed ([Errno 5] Input/output error)" in caplog.text
