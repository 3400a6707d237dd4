"""TorchTitan's CheckpointManager with atomic saves, checksums, and loads that check them first.

Save (synchronous DCP saves, the trainer's): DCP writes into ``<folder>/.partial-N``; each rank
hashes the files it wrote as soon as its own write is done (:class:`ChecksumWriter`), while slower
ranks still write; rank 0 then writes ``settings.json`` (the run's settings, for the resume rules)
and, with ``checkpoint.verify``, ``manifest.json`` (:mod:`parallax_titan.checksums`), and renames the
folder to ``step-N``. A ``step-N`` folder therefore only ever exists complete. A failed save (a full
disk, a read-only folder) raises :class:`CheckpointError` saying what failed, and the previous
checkpoint stays the newest. ``checkpoint.keep_latest_k`` keeps that many complete checkpoints up to
the step just saved, counting no incomplete or foreign folder and no newer step of an earlier run
(``checkpoint.load_step`` went back), so the step just saved is never deleted.

Background saves (``checkpoint.async_mode = "async"`` or ``"async_with_pinned_mem"``: the saves at
``checkpoint.interval``; the last step's and a stop's are synchronous) go the same way: DCP writes
``.partial-N`` behind training, and once its future is done on rank 0 (after every rank's write and
DCP's ``.metadata``: DCP gathers the ranks' results there before it writes that file) rank 0 alone
publishes the step from the future's done-callback, with no collective: it hashes the folder's files
for the manifest (a writer handed to DCP's checkpoint process is pickled, so no digests could come
back from it), writes ``settings.json`` and the manifest, renames the folder to ``step-N`` and then
applies ``keep_latest_k``. TorchTitan waits for the save at the start of the next one
(``_async_wait``, so also before the last step's save and a stop's); that wait now covers the
publication too, the ranks agree on its outcome, and a failure raises CheckpointError on every rank
naming the step and leaves the previous checkpoint the newest. :meth:`close` waits as well (a stop
right after the background save of its step saves nothing more). A run killed while a background
save is in flight leaves ``.partial-N``, which no loader counts.

Load: before TorchTitan loads a step, every rank hashes its share of the step's files and the
ranks agree on the result. A corrupt, truncated or missing file is named; the run then loads the
newest valid step instead (``checkpoint.on_corrupt = "fallback"``, with a warning; the bad folder is
renamed ``corrupt-N``) or stops (``"stop"``). A file DCP cannot read (``checkpoint.verify = false``)
stops the run naming the step folder. The check is :func:`parallax_titan.checkpoint_files.folder_problem`,
the one every other loader of a checkpoint runs too, here with the ranks' shares. A folder without a
complete step loads ``checkpoint.initial_load_path``, as a missing folder does in TorchTitan.

:func:`save_checksummed` writes a DCP folder with a manifest from one process, atomically too (a
folder made for ``checkpoint.initial_load_path``, such as ``scripts/export_hf.py import`` writes).
"""

from __future__ import annotations

import os
import re
import shutil
import sys
import time
from concurrent.futures import Future
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, Callable

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint import FileSystemWriter
from torch.distributed.checkpoint.api import CheckpointException
from torch.distributed.checkpoint.filesystem import FileSystem
from torch.distributed.checkpoint.state_dict_saver import AsyncSaveResponse
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
_PARTIAL = re.compile(r"\.partial-\d+")


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


def _digest_data_files(folder: str, algorithm: str) -> dict[str, FileEntry]:
    """Digests of the data files DCP wrote into ``folder`` (every plain file but the small ones
    :func:`_write_manifest` hashes itself), for a save whose ranks handed back no digests."""
    own = (METADATA_FILE, SETTINGS_FILE, MANIFEST_FILE)
    names = sorted(name for name in os.listdir(folder)
                   if name not in own and os.path.isfile(os.path.join(folder, name)))
    return digest_files(folder, names, checksum_threads(), algorithm)


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


def _save_failure(step: int, final: str, cause: str, how: str = "") -> str:
    """What failed in a save (``cause``: :func:`_cause` of the error; ``how``: how the save ran, such
    as " in the background"), the space left where it went, and the checkpoint that stays newest."""
    folder = os.path.dirname(final)
    if "unexpected pos" in cause:  # torch's file writer reports a short write (ENOSPC, EFBIG) so
        cause += ": a file could not be written in full"
    try:
        free = f"; {shutil.disk_usage(folder).free / 2**30:.1f} GiB free there"
    except OSError:
        free = ""
    steps = complete_steps(folder)
    newest = f"step-{steps[-1]}" if steps else "none"
    return (f"saving checkpoint step {step} to {final!r}{how} failed ({cause}){free}; nothing of it was kept, and "
            f"the newest complete checkpoint is {newest}")


def _partial_of(final: str) -> str:
    """Where a save of the step folder ``final`` (``.../step-N``) is written before it is renamed:
    ``.../.partial-N``, which no loader counts as a step."""
    return os.path.join(os.path.dirname(final), f".partial-{os.path.basename(final).split('-', 1)[1]}")


def _remove_stale_partials(folder: str) -> None:
    """Delete the ``.partial-N`` folders in ``folder``, logging each with its size."""
    names = os.listdir(folder) if os.path.isdir(folder) else []
    for name in sorted(n for n in names if _PARTIAL.fullmatch(n)):
        path = os.path.join(folder, name)
        size = sum(os.path.getsize(os.path.join(root, f)) for root, _, files in os.walk(path) for f in files)
        logger.warning(f"Removing {path!r} ({size / 2**30:.2f} GiB), left by a save that did not finish")
        shutil.rmtree(path, ignore_errors=True)


def _set_aside(path: str, prefix: str) -> str:
    """Rename the folder ``path`` to ``<parent>/<prefix>-<step>`` (plus a time if that exists)."""
    target = os.path.join(os.path.dirname(path), f"{prefix}-{os.path.basename(path).split('-', 1)[1]}")
    if os.path.exists(target):
        target = f"{target}.{int(time.time())}"
    os.rename(path, target)
    return target


@dataclass
class _BackgroundSave:
    """A step DCP writes in the background: its folders, when it began (for the log) and
    :attr:`published`, done once this rank's part is over (rank 0: the folder renamed ``step-N``)."""

    step: int
    partial: str
    final: str
    how: str
    begin: float = field(default_factory=time.monotonic)
    published: Future = field(default_factory=Future)


class ParallaxCheckpointManager(CheckpointManager):
    """TorchTitan's CheckpointManager (same arguments) with the save and load described above.

    The trainer sets :attr:`settings` (recorded in each checkpoint's ``settings.json``),
    :attr:`check_step` (called as ``check_step(step)`` with the step of the checkpoint folder a load
    chose, before anything of it is read; raises to refuse it) and :attr:`on_loaded` (called as
    ``on_loaded(step, saved_settings or None)`` after a load from the checkpoint folder, before the
    first step)."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        config = kwargs["checkpoint_config"]
        self.verify: bool = config.verify
        self.on_corrupt: str = config.on_corrupt
        self.keep_complete: int = config.keep_latest_k
        self.keep_latest_k = 0  # TorchTitan's purge would count incomplete folders; ours runs after each save
        self.settings: dict[str, Any] = {}
        self.check_step: Callable[[int], None] | None = None
        self.on_loaded: Callable[[int, dict | None], None] | None = None
        self.saved_steps: set[int] = set()
        self._background: _BackgroundSave | None = None  # the background save not yet waited for
        self._partials_cleared = False

    # ---- save -------------------------------------------------------------------------------

    @torch.no_grad()
    def dcp_save(self, state_dict, checkpoint_id, async_mode, enable_garbage_collection=False, to_hf=False):
        match = _STEP_ID.fullmatch(os.path.basename(os.fspath(checkpoint_id)))
        if match is None:
            return super().dcp_save(state_dict, checkpoint_id, async_mode, enable_garbage_collection, to_hf)
        step, final = int(match.group(1)), os.fspath(checkpoint_id)
        background, result = async_mode != AsyncMode.DISABLED and not to_hf, None
        if to_hf:  # TorchTitan's own (the Hugging Face export of the last step)
            result = super().dcp_save(state_dict, checkpoint_id, async_mode, enable_garbage_collection, to_hf)
        elif background:
            result = self._save_in_background(state_dict, step, final, async_mode)
        else:
            self._save_atomic(state_dict, step, final, enable_garbage_collection)
        self.saved_steps.add(step)
        if _rank() == 0 and not background:  # a background save purges once it is published
            self._purge(os.path.dirname(final), step)
        return result

    def _clear_partial(self, partial: str) -> None:
        """Empty ``partial`` of what a killed save left there, on rank 0 before any rank writes into it.
        The run's first save removes every ``.partial-N`` of the folder: each is what a killed save
        left (none of this run's is in flight yet), as large as a checkpoint, and no load reads it."""
        if _rank() == 0:
            if not self._partials_cleared:
                self._partials_cleared = True
                _remove_stale_partials(os.path.dirname(partial))
            if os.path.exists(partial):
                shutil.rmtree(partial)
        _barrier()

    def _save_atomic(self, state_dict, step: int, final: str, enable_garbage_collection: bool) -> None:
        """DCP into ``.partial-<step>``, then :meth:`_publish`; CheckpointError (every rank) on failure."""
        partial = _partial_of(final)
        begin = time.monotonic()
        try:
            self._clear_partial(partial)
            writer = (ChecksumWriter(partial, checksum_threads(), default_algorithm()) if self.verify
                      else FileSystemWriter(partial))
            dcp.save(state_dict, storage_writer=writer)
            if enable_garbage_collection:
                GarbageCollection.collect("GC collection invoked by checkpointer.")
            self._publish(step, partial, final, writer)
        except (Exception, CheckpointException) as exc:
            if _rank() == 0:
                shutil.rmtree(partial, ignore_errors=True)
            raise CheckpointError(_save_failure(step, final, _cause(exc))) from None
        logger.info(f"Checkpoint step-{step} complete in {time.monotonic() - begin:.2f} s"
                    + (" (with checksums)" if self.verify else ""))

    def _publish(self, step: int, partial: str, final: str, writer) -> None:
        """Gather the ranks' digests; rank 0 publishes (:meth:`_publish_here`). Every rank raises if
        that failed."""
        digests = _all_gather(getattr(writer, "digests", {}))
        failure = None
        if _rank() == 0:
            try:
                self._publish_here(step, partial, final, digests, getattr(writer, "algorithm", default_algorithm()))
            except Exception as exc:  # every rank must reach the broadcast below
                failure = f"{type(exc).__name__}: {exc}"
        failure = _from_rank0(failure)
        if failure:
            raise RuntimeError(failure)

    def _publish_here(self, step: int, partial: str, final: str, digests: list[dict[str, FileEntry]] | None,
                      algorithm: str) -> None:
        """Rank 0's part of a save once every rank's files and ``.metadata`` are written: settings,
        manifest (from the ranks' ``digests``; None: hashing the folder's files here), then the
        rename that makes ``step-<step>`` exist, complete. Raises what failed before the rename; after
        it the step is complete, and a failed sync of its parent folder is only logged."""
        write_settings(partial, step, self.settings)
        if self.verify:
            _write_manifest(partial, [_digest_data_files(partial, algorithm)] if digests is None else digests,
                            algorithm)
        fsync_path(partial)  # the new files' names, before the rename publishes them
        if os.path.exists(final):
            logger.warning(f"{final!r} exists; moved to {_set_aside(final, 'superseded')!r}")
        os.rename(partial, final)
        try:
            fsync_path(os.path.dirname(final))
        except OSError as exc:  # reported as a failed save, it would say nothing was kept while step-N exists
            logger.warning(f"checkpoint {final!r} is complete, but syncing its parent folder failed ({exc}): the "
                           "rename may not survive a power loss")

    # ---- background save --------------------------------------------------------------------

    def _save_in_background(self, state_dict, step: int, final: str, async_mode: AsyncMode):
        """TorchTitan's background save of ``step``, written into ``.partial-<step>``; rank 0 publishes
        it when DCP's future is done (:meth:`_publish_when_written`). Returns TorchTitan's future (or
        AsyncSaveResponse) with the write's completion replaced by the publication's, so that its
        ``_async_wait`` waits for both. CheckpointError (every rank) when the save cannot start."""
        save = _BackgroundSave(step, _partial_of(final), final,
                               f" in the background (checkpoint.async_mode = {async_mode.value!r})")
        try:
            self._clear_partial(save.partial)
            result = super().dcp_save(state_dict, save.partial, async_mode)
        except (Exception, CheckpointException) as exc:
            if _rank() == 0:
                shutil.rmtree(save.partial, ignore_errors=True)
            raise CheckpointError(_save_failure(step, final, _cause(exc), save.how)) from None
        self._background = save
        written = result.upload_completion if isinstance(result, AsyncSaveResponse) else result
        coordinator = _rank() == 0  # taken here: the callback runs in DCP's thread
        written.add_done_callback(lambda future: self._publish_when_written(save, future, coordinator))
        if isinstance(result, AsyncSaveResponse):
            return AsyncSaveResponse(staging_completion=result.staging_completion, upload_completion=save.published)
        return save.published

    def _publish_when_written(self, save: _BackgroundSave, written: Future, coordinator: bool) -> None:
        """Done-callback of DCP's future (in DCP's thread): on rank 0 its success means every rank's
        files and ``.metadata`` are on disk, so rank 0 publishes here without any collective (other
        ranks have nothing to do). Never raises: the outcome goes to ``save.published``."""
        try:
            written.result()
            if coordinator:
                self._publish_here(save.step, save.partial, save.final, None, default_algorithm())
        except BaseException as exc:  # DCP's CheckpointException is a BaseException
            if coordinator:
                shutil.rmtree(save.partial, ignore_errors=True)
            save.published.set_exception(exc)
            return
        if coordinator:
            logger.info(f"Checkpoint step-{save.step} complete{save.how} in {time.monotonic() - save.begin:.2f} s"
                        + (" (with checksums)" if self.verify else ""))
            self._purge_quietly(os.path.dirname(save.final), save.step)
        save.published.set_result(None)

    def _purge_quietly(self, folder: str, saved: int) -> None:
        """:meth:`_purge` after the background save of step ``saved``, which is already published: a
        failure to delete an old step is logged, never reported as a failed save."""
        try:
            self._purge(folder, saved)
        except Exception as exc:
            logger.warning(f"checkpoint.keep_latest_k: could not delete old checkpoints in {folder!r} "
                           f"({type(exc).__name__}: {exc})")

    def _finish_background(self, save: _BackgroundSave) -> str | None:
        """Wait (TorchTitan's ``_async_wait``) for ``save``, its publication included; what failed
        (None: nothing). TorchTitan keeps a pinned-memory save's future after the wait; it is
        dropped here, or every later wait would raise its failure again."""
        try:
            super()._async_wait()
        except (Exception, CheckpointException) as exc:
            return _cause(exc)
        finally:
            self.save_future = None
        return None

    def _async_wait(self) -> None:
        """TorchTitan's wait for the background save, at the start of every save: it now also waits for
        rank 0 to publish it, and the ranks agree (rank 0 alone knows whether that worked), so every
        rank raises the same CheckpointError naming the step, or none does."""
        save, self._background = self._background, None
        if save is None:
            return super()._async_wait()
        failures = [f for f in _all_gather(self._finish_background(save)) if f]
        if failures:
            raise CheckpointError(_save_failure(save.step, save.final, failures[0], save.how))

    def close(self) -> None:
        """Wait for a background save before TorchTitan's close, which would leave it running: a run
        that ends right after one (``reliability.stop_at_step`` at a save's step) would exit before
        it is published. Waits on this rank only (the other ranks may be gone); a failure raises
        CheckpointError, or is logged while another error is on its way out."""
        save, self._background = getattr(self, "_background", None), None
        try:
            failure = self._finish_background(save) if save is not None else None
        finally:
            super().close()
        if failure:
            message = _save_failure(save.step, save.final, failure, save.how)
            if sys.exc_info()[1] is not None:
                logger.error(message)
            else:
                raise CheckpointError(message)

    def _purge(self, folder: str, saved: int) -> None:
        """Delete complete checkpoints beyond the newest ``keep_latest_k`` up to step ``saved`` (the one
        just saved; never an incomplete folder). Steps above it are an earlier run's, which this run
        went back from (``checkpoint.load_step``): counted, they would delete the step just saved."""
        if self.keep_complete <= 0:
            return
        steps = [step for step in self._complete_steps(folder) if step <= saved]
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
        chosen, passed = choose_step(self.folder, step, self._problem_of, self.on_corrupt == "stop")
        if chosen is None:
            return self._load_initial(step)
        if passed:
            self._set_aside_corrupt(passed, chosen)
        if step >= 0:  # else the newest valid step, the invalid ones above it set aside
            self._warn_of_newer_steps(chosen)
        if self.check_step is not None:
            self.check_step(chosen)
        path = step_dir(self.folder, chosen)
        try:
            loaded = super().load(step=chosen)
        except (Exception, CheckpointException) as exc:
            raise CheckpointError(f"loading checkpoint {path!r} failed ({_cause(exc)}); a truncated or damaged file? "
                                  "checkpoint.verify = true names the file and falls back to an older step") from None
        if loaded and self.on_loaded is not None:
            self.on_loaded(chosen, read_settings(path))
        return loaded

    def _load_initial(self, step: int) -> bool:
        """TorchTitan's load for a run with no complete step in its checkpoint folder:
        ``checkpoint.initial_load_path`` (checked first), if any. TorchTitan takes that path only where
        the folder does not exist, and a folder without a complete step (an empty one after a failed
        first save, a killed first save's ``.partial-N``) has nothing to resume either: TorchTitan would
        start it from random weights without a word."""
        self._check_initial_load()
        folder, self.folder = self.folder, ""  # TorchTitan reads the folder only to test that it exists
        try:
            return super().load(step)
        finally:
            self.folder = folder

    def _warn_of_newer_steps(self, chosen: int) -> None:
        """Name the complete steps above ``chosen`` (``checkpoint.load_step`` went back): the run
        replaces each when it saves that step; until then a rerun without that key resumes them."""
        newer = [step for step in complete_steps(self.folder) if step > chosen]
        if newer:
            logger.warning(f"checkpoint.load_step = {chosen}: {self.folder!r} holds newer steps of a run before "
                           f"this one ({', '.join(f'step-{s}' for s in newer)}); this run replaces each when it saves "
                           f"that step, and until then a rerun without checkpoint.load_step resumes step-{newer[-1]}")

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
