"""TorchTitan's CheckpointManager with atomic saves, checksums, and loads that check them first.

Save (synchronous DCP saves, the trainer's): DCP writes into ``<folder>/.partial-N``; each rank
hashes the files it wrote as soon as its own write is done (:class:`ChecksumWriter`), while slower
ranks still write; rank 0 then writes ``settings.json`` (the run's settings, for the resume rules)
and, with ``checkpoint.verify``, ``manifest.json`` (:mod:`parallax_titan.checksums`), and renames the
folder to ``step-N``. A ``step-N`` folder therefore only ever exists complete. A failed save (a full
disk, a read-only folder) raises :class:`CheckpointError` saying what failed, and the previous
checkpoint stays the newest. ``checkpoint.keep_latest_k`` keeps that many complete checkpoints,
counting no incomplete or foreign folder, so the newest complete one is never deleted.

Load: before TorchTitan loads a step, every rank hashes its share of the step's files and the
ranks agree on the result. A corrupt, truncated or missing file is named; the run then loads the
newest valid step instead (``checkpoint.on_corrupt = "fallback"``, with a warning; the bad folder is
renamed ``corrupt-N``) or stops (``"stop"``). A file DCP cannot read (``checkpoint.verify = false``)
stops the run naming the step folder. The check is :func:`parallax_titan.checkpoint_files.folder_problem`,
the one every other loader of a checkpoint runs too, here with the ranks' shares.

:func:`save_checksummed` writes a DCP folder with a manifest from one process, atomically too (a
folder made for ``checkpoint.initial_load_path``, such as ``scripts/export_hf.py import`` writes).
"""

from __future__ import annotations

import os
import re
import shutil
import time
from contextlib import contextmanager
from typing import Any, Callable

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint import FileSystemWriter
from torch.distributed.checkpoint.api import CheckpointException
from torch.distributed.checkpoint.filesystem import FileSystem
from torchtitan.components.checkpoint import AsyncMode, CheckpointManager
from torchtitan.tools.logging import logger
from torchtitan.tools.utils import GarbageCollection

from parallax_titan.checkpoint_files import (
    DCP_OUTPUT, METADATA_FILE, SETTINGS_FILE, CheckpointError, checksum_threads, choose_step, complete_steps, dcp_owned,
    folder_problem, fsync_path, replaced_folder, step_dir, verify_before_load)
from parallax_titan.checksums import MANIFEST_FILE, FileEntry, default_algorithm, digest_files, write_manifest
from parallax_titan.resume_rules import read_settings, write_settings

__all__ = ["CheckpointError", "ChecksumWriter", "ParallaxCheckpointManager", "checksum_threads", "save_checksummed",
           "verify_on_every_rank"]

_STEP_ID = re.compile(r"step-(\d+)")


class _RecordingFileSystem(FileSystem):
    """DCP's local file system, noting every file opened for writing."""

    def __init__(self) -> None:
        super().__init__()
        self.written: list[str] = []

    @contextmanager
    def create_stream(self, path, mode):
        if "w" in mode:
            self.written.append(os.fspath(path))
        with super().create_stream(path, mode) as stream:
            yield stream


class ChecksumWriter(FileSystemWriter):
    """DCP's FileSystemWriter that hashes the files this rank wrote right after writing them
    (before DCP gathers the ranks' results), in ``threads`` threads; see :attr:`digests`."""

    def __init__(self, path: str, threads: int, algorithm: str) -> None:
        super().__init__(path)
        self.fs = _RecordingFileSystem()
        self.threads, self.algorithm = threads, algorithm
        self.digests: dict[str, FileEntry] = {}

    def write_data(self, plan, planner):
        written = super().write_data(plan, planner)
        written.wait()
        folder = os.fspath(self.path)
        names = sorted(os.path.relpath(p, folder) for p in self.fs.written)
        self.digests = digest_files(folder, names, self.threads, self.algorithm)
        return written


def _write_manifest(folder: str, written: list[dict[str, FileEntry]], algorithm: str) -> str:
    """``folder/manifest.json`` from the digests of the files the ranks wrote (:attr:`ChecksumWriter.digests`,
    one dict per rank) plus ``.metadata`` and ``settings.json``, where present (written last, by one
    process); returns its path."""
    files = {name: entry for part in written for name, entry in part.items()}
    small = [name for name in (METADATA_FILE, SETTINGS_FILE) if os.path.isfile(os.path.join(folder, name))]
    files.update(digest_files(folder, small, 1, algorithm))
    return write_manifest(folder, files, algorithm)


def save_checksummed(state_dict: dict, folder: str, threads: int | None = None, key: str = "folder") -> str:
    """``dcp.save`` of ``state_dict`` into ``folder`` by this process alone, with a manifest of the
    files it wrote, as the trainer's saves carry: the folder verifies wherever it is loaded (the
    trainer's ``checkpoint.initial_load_path``, the evaluation loaders). Returns the manifest's path.

    Atomic, as the trainer's saves: written into a folder beside ``folder`` that then replaces it
    whole (:func:`replaced_folder`), so a failed save leaves an earlier checkpoint there as it was.
    ``folder`` must be new, empty or such a folder (DCP files and a manifest only); anything else,
    a trainer's step with its ``settings.json`` included, raises ValueError naming ``key`` before
    anything is written."""
    with replaced_folder(folder, key, dcp_owned, DCP_OUTPUT) as stage:
        writer = ChecksumWriter(stage, checksum_threads() if threads is None else threads, default_algorithm())
        dcp.save(state_dict, storage_writer=writer, no_dist=True)
        _write_manifest(stage, [writer.digests], writer.algorithm)
    return os.path.join(folder, MANIFEST_FILE)


def _rank() -> int:
    return dist.get_rank() if dist.is_initialized() else 0


def _all_gather(value: Any) -> list[Any]:
    if not dist.is_initialized():
        return [value]
    out: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(out, value)
    return out


def _from_rank0(value: Any) -> Any:
    if not dist.is_initialized():
        return value
    box = [value]
    dist.broadcast_object_list(box, src=0)
    return box[0]


def _world() -> int:
    return dist.get_world_size() if dist.is_initialized() else 1


def verify_on_every_rank(checkpoint_dir: str, who: str, off_switch: str, verify: bool = True) -> None:
    """:func:`verify_before_load` of ``checkpoint_dir`` by every rank of the default process group
    together (each must call it): each hashes its share of the files, in threads, and all of them
    raise the same CheckpointError or none. Without ``torch.distributed``, this process checks alone."""
    verify_before_load(checkpoint_dir, who, off_switch, verify, checksum_threads(), _rank(), _world(), _all_gather)


def _barrier() -> None:
    if dist.is_initialized():
        dist.barrier()


def _cause(exc: BaseException) -> str:
    """The first rank's original error inside DCP's CheckpointException, else ``exc`` itself."""
    if isinstance(exc, CheckpointException) and exc.failures:
        rank, (inner, _) = min(exc.failures.items(), key=lambda item: item[0])
        return f"{type(inner).__name__} on rank {rank}: {inner}"
    return f"{type(exc).__name__}: {exc}"


def _save_failure(step: int, final: str, exc: BaseException) -> str:
    """What failed in a save, the space left where it went, and the checkpoint that stays newest."""
    folder = os.path.dirname(final)
    cause = _cause(exc)
    if "unexpected pos" in cause:  # torch's file writer reports a short write (ENOSPC, EFBIG) so
        cause += ": a file could not be written in full"
    try:
        free = f"; {shutil.disk_usage(folder).free / 2**30:.1f} GiB free there"
    except OSError:
        free = ""
    steps = complete_steps(folder)
    newest = f"step-{steps[-1]}" if steps else "none"
    return (f"saving checkpoint step {step} to {final!r} failed ({cause}){free}; nothing of it was kept, and the "
            f"newest complete checkpoint is {newest}")


def _set_aside(path: str, prefix: str) -> str:
    """Rename the folder ``path`` to ``<parent>/<prefix>-<step>`` (plus a time if that exists)."""
    target = os.path.join(os.path.dirname(path), f"{prefix}-{os.path.basename(path).split('-', 1)[1]}")
    if os.path.exists(target):
        target = f"{target}.{int(time.time())}"
    os.rename(path, target)
    return target


class ParallaxCheckpointManager(CheckpointManager):
    """TorchTitan's CheckpointManager (same arguments) with the save and load described above.

    The trainer sets :attr:`settings` (recorded in each checkpoint's ``settings.json``) and
    :attr:`on_loaded` (called as ``on_loaded(step, saved_settings or None)`` after a load from
    the checkpoint folder, before the first step)."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        config = kwargs["checkpoint_config"]
        self.verify: bool = config.verify
        self.on_corrupt: str = config.on_corrupt
        self.keep_complete: int = config.keep_latest_k
        self.keep_latest_k = 0  # TorchTitan's purge would count incomplete folders; ours runs after each save
        self.settings: dict[str, Any] = {}
        self.on_loaded: Callable[[int, dict | None], None] | None = None
        self.saved_steps: set[int] = set()

    # ---- save -------------------------------------------------------------------------------

    @torch.no_grad()
    def dcp_save(self, state_dict, checkpoint_id, async_mode, enable_garbage_collection=False, to_hf=False):
        match = _STEP_ID.fullmatch(os.path.basename(os.fspath(checkpoint_id)))
        if match is None:
            return super().dcp_save(state_dict, checkpoint_id, async_mode, enable_garbage_collection, to_hf)
        step, final = int(match.group(1)), os.fspath(checkpoint_id)
        result = None
        if to_hf or async_mode != AsyncMode.DISABLED:  # TorchTitan's own (Hugging Face export, background save)
            result = super().dcp_save(state_dict, checkpoint_id, async_mode, enable_garbage_collection, to_hf)
        else:
            self._save_atomic(state_dict, step, final, enable_garbage_collection)
        self.saved_steps.add(step)
        if _rank() == 0:
            self._purge(os.path.dirname(final))
        return result

    def _save_atomic(self, state_dict, step: int, final: str, enable_garbage_collection: bool) -> None:
        """DCP into ``.partial-<step>``, then :meth:`_publish`; CheckpointError (every rank) on failure."""
        partial = os.path.join(os.path.dirname(final), f".partial-{step}")
        begin = time.monotonic()
        try:
            if _rank() == 0 and os.path.exists(partial):
                shutil.rmtree(partial)  # left by a killed save
            _barrier()
            writer = (ChecksumWriter(partial, checksum_threads(), default_algorithm()) if self.verify
                      else FileSystemWriter(partial))
            dcp.save(state_dict, storage_writer=writer)
            if enable_garbage_collection:
                GarbageCollection.collect("GC collection invoked by checkpointer.")
            self._publish(step, partial, final, writer)
        except (Exception, CheckpointException) as exc:
            if _rank() == 0:
                shutil.rmtree(partial, ignore_errors=True)
            raise CheckpointError(_save_failure(step, final, exc)) from None
        logger.info(f"Checkpoint step-{step} complete in {time.monotonic() - begin:.2f} s"
                    + (" (with checksums)" if self.verify else ""))

    def _publish(self, step: int, partial: str, final: str, writer) -> None:
        """Gather the ranks' digests; rank 0 writes settings and manifest and renames the folder.
        Every rank raises if that failed."""
        digests = _all_gather(getattr(writer, "digests", {}))
        failure = None
        if _rank() == 0:
            try:
                write_settings(partial, step, self.settings)
                if self.verify:
                    _write_manifest(partial, digests, writer.algorithm)
                if os.path.exists(final):
                    logger.warning(f"{final!r} exists; moved to {_set_aside(final, 'superseded')!r}")
                os.rename(partial, final)
                fsync_path(os.path.dirname(final))
            except Exception as exc:  # every rank must reach the broadcast below
                failure = f"{type(exc).__name__}: {exc}"
        failure = _from_rank0(failure)
        if failure:
            raise RuntimeError(failure)

    def _purge(self, folder: str) -> None:
        """Delete complete checkpoints beyond the newest ``keep_latest_k`` (never an incomplete folder)."""
        if self.keep_complete <= 0:
            return
        steps = self._complete_steps(folder)
        for step in steps[:-self.keep_complete]:
            logger.info(f"Deleting checkpoint step-{step} (checkpoint.keep_latest_k = {self.keep_complete})")
            shutil.rmtree(step_dir(folder, step), ignore_errors=True)

    def _complete_steps(self, folder: str) -> list[int]:
        steps = complete_steps(folder)
        if self.verify:
            steps = [s for s in steps if os.path.isfile(os.path.join(step_dir(folder, s), MANIFEST_FILE))]
        return steps

    # ---- load -------------------------------------------------------------------------------

    @torch.no_grad()
    def load(self, step: int = -1) -> bool:
        if not self.enable:
            return super().load(step)
        if not os.path.isdir(self.folder):
            self._check_initial_load()
            return super().load(step)
        chosen, passed = choose_step(self.folder, step, self._problem_of, self.on_corrupt == "stop")
        if chosen is None:
            return False
        if passed:
            self._set_aside_corrupt(passed, chosen)
        path = step_dir(self.folder, chosen)
        try:
            loaded = super().load(step=chosen)
        except (Exception, CheckpointException) as exc:
            raise CheckpointError(f"loading checkpoint {path!r} failed ({_cause(exc)}); a truncated or damaged file? "
                                  "checkpoint.verify = true names the file and falls back to an older step") from None
        if loaded and self.on_loaded is not None:
            self.on_loaded(chosen, read_settings(path))
        return loaded

    def _problem_of(self, step: int) -> str | None:
        """What is wrong with ``step-<step>`` (None: valid, or checksums are off)."""
        return self._agreed_problem(step_dir(self.folder, step)) if self.verify else None

    def _agreed_problem(self, path: str) -> str | None:
        """The first problem any rank finds in the checkpoint folder ``path`` (the same on every rank):
        :func:`folder_problem`, every rank checking the sizes of its share of the files and hashing it
        (every world-size-th file of the manifest, in threads)."""
        begin = time.monotonic()
        problem = folder_problem(path, checksum_threads(), _rank(), _world(), _all_gather)
        logger.info(f"Checked the checksums of {path} in {time.monotonic() - begin:.2f} s")
        return problem

    def _set_aside_corrupt(self, passed: list, chosen: int) -> None:
        """Warn about each step passed over; rank 0 renames their folders ``corrupt-N``."""
        for step, problem in passed:
            logger.warning(f"checkpoint step-{step} is not valid: {problem}; checkpoint.on_corrupt = 'fallback': "
                           f"loading step-{chosen} instead")
        if _rank() == 0:  # every rank has checked (the gathers in _agreed_problem) before anything moves
            for step, _ in passed:
                moved = _set_aside(step_dir(self.folder, step), "corrupt")
                logger.warning(f"step-{step} is moved to {moved!r}")

    def _check_initial_load(self) -> None:
        """Check ``checkpoint.initial_load_path`` against its manifest, where it has one (no fallback)."""
        path = self.initial_load_path
        if self.verify and path and os.path.isfile(os.path.join(path, MANIFEST_FILE)):
            verify_on_every_rank(path, "checkpoint.initial_load_path", "checkpoint.verify = false")
