"""DCP checkpoint folders on disk: which steps are complete, what weights they hold, whether they fit a model.

The trainer writes ``<dump_folder>/<checkpoint.folder>/step-N``; a step is complete once DCP has
written its ``.metadata`` file (the last file of a save). Its model weights sit at the top level
under the model's own names (``layers.0.attention.wq.weight``); TorchTitan's other training
states (optimizer, lr schedule, data loader, train state) sit under their own prefixes beside
them and are not model weights. Beside ``.metadata`` the trainer writes ``settings.json`` (the
run's settings that resume rules compare) and, with ``checkpoint.verify``, ``manifest.json``
(checksums, :mod:`parallax_titan.checksums`). Everything here reads metadata and those small
files only, never tensor data, except :func:`folder_problem` and :func:`verify_before_load`, which
hash every file a manifest lists: the check every loader of a checkpoint runs first (the trainer's
resume, ``parallax.init_from_transformer``, evaluation, generation, export and analysis).
"""

from __future__ import annotations

import os
import re
import shutil
import time
from contextlib import contextmanager
from typing import Callable, Iterator, NamedTuple

import torch
from torch.distributed.checkpoint import FileSystemReader
from torch.distributed.checkpoint.metadata import TensorStorageMetadata
from torchtitan.components.checkpoint import DATALOADER, LR_SCHEDULER, OPTIMIZER, TRAIN_STATE

from parallax_titan.checksums import MANIFEST_FILE, Manifest, content_problems, read_manifest, size_problems

METADATA_FILE = ".metadata"
SETTINGS_FILE = "settings.json"
HF_INDEX_FILE = "model.safetensors.index.json"  # in a step of TorchTitan's Hugging Face last save
TRAINING_STATES = (OPTIMIZER, LR_SCHEDULER, DATALOADER, TRAIN_STATE)
_STEP = re.compile(r"step-(\d+)")

Shapes = dict[str, tuple[int, ...]]


def step_dir(folder: str, step: int) -> str:
    """``folder/step-<step>``."""
    return os.path.join(folder, f"step-{step}")


def _steps_with(folder: str, filename: str) -> list[int]:
    """Ascending steps N whose ``folder/step-N`` holds ``filename``. Raises ValueError for such a folder
    named with leading zeros (``step-02``): its step would be looked for as ``step-2``, by us and by
    TorchTitan, and not found."""
    if not os.path.isdir(folder):
        return []
    matches = (_STEP.fullmatch(name) for name in os.listdir(folder))
    found = [m for m in matches if m and os.path.isfile(os.path.join(folder, m.group(0), filename))]
    for m in found:
        if m.group(1) != str(int(m.group(1))):
            raise ValueError(f"{os.path.join(folder, m.group(0))!r}: a checkpoint step folder named with leading "
                             f"zeros, which is read as step {int(m.group(1))} at {step_dir(folder, int(m.group(1)))!r} "
                             f"and not found; expected it renamed to step-{int(m.group(1))}")
    return sorted(int(m.group(1)) for m in found)


def complete_steps(folder: str) -> list[int]:
    """Ascending steps N whose ``folder/step-N`` holds a DCP ``.metadata`` file; [] without ``folder``."""
    return _steps_with(folder, METADATA_FILE)


def step_to_load(folder: str, load_step: int = -1) -> int | None:
    """The step a run resumes from: ``load_step`` when >= 0, else the newest complete one (None: none).

    Raises ValueError naming the step folder and the complete steps when ``load_step`` is not
    complete, and when the newest step is a Hugging Face save (TorchTitan would pick it to resume
    from, and cannot load it).
    """
    steps = complete_steps(folder)
    found = ", ".join(map(str, steps)) if steps else "none"
    if load_step < 0:
        exported = [s for s in _steps_with(folder, HF_INDEX_FILE) if s not in steps]
        if exported and (not steps or exported[-1] > steps[-1]):
            raise ValueError(f"step {exported[-1]}: {step_dir(folder, exported[-1])!r} is a Hugging Face save "
                             "(checkpoint.last_save_in_hf), which TorchTitan would resume from but cannot load; set "
                             f"checkpoint.load_step to a complete DCP step ({found}) or move that folder away")
        return steps[-1] if steps else None
    if load_step not in steps:
        path = step_dir(folder, load_step)
        state = "has no .metadata (an incomplete save)" if os.path.isdir(path) else "does not exist"
        raise ValueError(f"step {load_step}: {path!r} {state}; complete steps in {folder!r}: {found}")
    return load_step


class CheckpointError(RuntimeError):
    """A checkpoint cannot be saved or loaded; the message names the step folder and the file."""


def checksum_threads() -> int:
    """Hashing threads per process: this host's cores shared by its ranks (``LOCAL_WORLD_SIZE``), 1 to 16."""
    ranks_here = int(os.environ.get("LOCAL_WORLD_SIZE", "1"))
    return max(1, min(16, (os.cpu_count() or 1) // max(1, ranks_here)))


def _no_manifest(exc: ValueError) -> str:
    return f"{exc}, so its files cannot be checked (saved with checkpoint.verify = false or by another program)"


def has_checkpoint_files(path: str) -> bool:
    """Whether the folder ``path`` holds a manifest or a DCP ``.metadata`` file (else it is no
    checkpoint at all, or does not exist: :func:`saved_shapes` says which)."""
    return any(os.path.isfile(os.path.join(path, name)) for name in (MANIFEST_FILE, METADATA_FILE))


def unlisted_problems(checkpoint_dir: str, manifest: Manifest) -> list[str]:
    """The files of the checkpoint folder that a load reads (DCP's ``.metadata`` and ``*.distcp``,
    ``settings.json``) and its manifest does not list: no check would cover them."""
    names = sorted(name for name in os.listdir(checkpoint_dir) if name not in manifest.files
                   and (name == SETTINGS_FILE or dcp_owned(name) and name != MANIFEST_FILE))
    return [f"{os.path.join(checkpoint_dir, name)}: not listed in {MANIFEST_FILE}, so it cannot be checked (the "
            "manifest is another save's, or the file was added since)" for name in names]


def quick_problem(checkpoint_dir: str, off_switch: str | None = "checkpoint.verify = false") -> str | None:
    """The first problem :func:`parallax_titan.checksums` finds in a step folder without reading its
    tensor files: no readable manifest (then naming ``off_switch``, which loads it unchecked, unless
    None), a file the load reads that it does not list, a listed file missing or of another size (a
    truncated file), or ``.metadata`` / ``settings.json`` differing from their checksums. None: none found."""
    try:
        manifest = read_manifest(checkpoint_dir)
    except ValueError as exc:
        return _no_manifest(exc) + (f"; {off_switch} loads it unchecked" if off_switch else "")
    small = [name for name in (METADATA_FILE, SETTINGS_FILE) if name in manifest.files]
    large = [name for name in manifest.files if name not in small]
    problems = (unlisted_problems(checkpoint_dir, manifest) + size_problems(checkpoint_dir, manifest, large)
                + content_problems(checkpoint_dir, manifest, small))
    return problems[0] if problems else None


def folder_problem(checkpoint_dir: str, threads: int = 1, rank: int = 0, world: int = 1,
                   gather: Callable[[list[str]], list[list[str]]] | None = None) -> str | None:
    """The first problem of the checkpoint folder ``checkpoint_dir`` against its manifest: no
    readable manifest, a file the load reads that it does not list (:func:`unlisted_problems`), a
    listed file missing or of another size (naming the file and both sizes), or a chunk whose
    checksum differs (naming the file and the bytes). None: every listed file is intact and every
    file the load reads is listed. Hashes in ``threads`` threads.

    Several processes share the work: each passes its ``rank`` of ``world`` and ``gather``, an
    all-gather of one Python object that returns every rank's in rank order (such as
    ``torch.distributed.all_gather_object`` into a list). Each hashes every ``world``-th file of the
    manifest and all of them return the same answer; every rank reaches ``gather``, whatever it found.
    """
    try:
        manifest = read_manifest(checkpoint_dir)
    except ValueError as exc:
        local = [_no_manifest(exc)]
    else:
        try:
            local = (unlisted_problems(checkpoint_dir, manifest)
                     + content_problems(checkpoint_dir, manifest, sorted(manifest.files)[rank::world], threads))
        except (OSError, ValueError) as exc:  # a file vanished while hashed, an unknown algorithm
            local = [f"{checkpoint_dir}: cannot be checked ({type(exc).__name__}: {exc})"]
    problems = sorted(p for part in (gather(local) if gather else [local]) for p in part)
    return problems[0] if problems else None


def verify_before_load(checkpoint_dir: str, who: str, off_switch: str, verify: bool = True,
                       threads: int | None = None, rank: int = 0, world: int = 1,
                       gather: Callable[[list[str]], list[list[str]]] | None = None) -> None:
    """Refuse to load the checkpoint folder ``checkpoint_dir`` unless every file its manifest lists
    has its size and checksum (:func:`folder_problem`; ``rank``, ``world``, ``gather``: the ranks'
    shares). A folder without a readable manifest is refused too (saved with ``checkpoint.verify =
    false`` or by another program). ``verify`` false: nothing is checked.

    Raises CheckpointError naming ``who`` (the option or key that named the folder, such as
    ``--checkpoint`` or ``parallax.init_from_transformer``), the folder, the first problem and
    ``off_switch`` (how that entry point loads the folder unchecked, such as ``--no-verify``). A path
    that is no checkpoint at all (no manifest and no DCP ``.metadata``: a missing folder, the
    ``checkpoint`` folder above the steps) is left to the loader's own error (:func:`saved_shapes`).
    """
    if not verify or not has_checkpoint_files(checkpoint_dir):
        return
    threads = checksum_threads() if threads is None else threads
    problem = folder_problem(checkpoint_dir, threads, rank, world, gather)
    if problem:
        raise CheckpointError(f"{who}: {checkpoint_dir!r} is not a valid checkpoint: {problem}; nothing was loaded "
                              f"({off_switch} loads it unchecked)")


def choose_step(folder: str, load_step: int, problem_of, stop_on_corrupt: bool) -> tuple[int | None, list]:
    """The step a run resumes from, and the newer steps passed over: ``(step, [(step, problem), ...])``.

    ``problem_of(step)`` returns what is wrong with ``folder/step-<step>`` (None: it is valid).
    ``load_step`` >= 0: that step, which must be complete (ValueError, as :func:`step_to_load`) and
    valid (else CheckpointError: an explicit step has no fallback). Otherwise the newest complete
    step that is valid, going back over invalid ones unless ``stop_on_corrupt`` (then the first
    invalid one raises CheckpointError). ``(None, [])`` when there is no complete step; CheckpointError
    when none of them is valid.
    """
    newest = step_to_load(folder, load_step)
    if newest is None:
        return None, []
    candidates = [newest] if load_step >= 0 else [s for s in reversed(complete_steps(folder)) if s <= newest]
    passed = []
    for step in candidates:
        problem = problem_of(step)
        if problem is None:
            return step, passed
        if load_step >= 0 or stop_on_corrupt:
            why = "checkpoint.load_step names it" if load_step >= 0 else "checkpoint.on_corrupt = 'stop'"
            raise CheckpointError(f"checkpoint {step_dir(folder, step)!r} is not valid: {problem}; not loaded ({why})")
        passed.append((step, problem))
    found = "; ".join(f"step {s}: {p}" for s, p in passed)
    raise CheckpointError(f"no valid checkpoint in {folder!r}: {found}; move the folder away to start from step 0")


DCP_OUTPUT = "a checkpoint of save_checksummed (DCP files and manifest.json only)"
"""What :func:`dcp_owned` accepts, for :func:`check_output_folder`'s message."""


def dcp_owned(name: str) -> bool:
    """Whether ``name`` is a file :func:`parallax_titan.checkpointing.save_checksummed` writes (DCP's
    ``.metadata`` and ``*.distcp`` files and the manifest; a trainer's step also holds ``settings.json``)."""
    return name in (METADATA_FILE, MANIFEST_FILE) or name.endswith(".distcp")


def unwritable_folder(folder: str) -> str | None:
    """Why ``folder`` cannot be written or created (the nearest folder above it that exists is not a
    writable folder), as a message naming both, or None when it can."""
    existing = os.path.abspath(folder)
    while not os.path.exists(existing):  # the folder that makedirs would create the rest in
        existing = os.path.dirname(existing)
    if not os.path.isdir(existing) or not os.access(existing, os.W_OK | os.X_OK):
        return f"cannot create or write {folder!r} ({existing!r} is not a writable folder)"
    return None


def output_folder_problem(folder: str, key: str) -> str | None:
    """Why ``folder`` (named by ``key``) cannot be an output folder, or None: an empty path (an unset
    shell variable: it passes the checks below and fails only at the first write), a file, or a
    folder that cannot be made or written (:func:`unwritable_folder`). Cheap: before the work."""
    if not str(folder).strip():
        return f"{key}: got '', which names no folder"
    if os.path.exists(folder) and not os.path.isdir(folder):
        return f"{key}: {folder!r} is a file"
    unwritable = unwritable_folder(folder)
    return f"{key}: {unwritable}" if unwritable else None


def check_output_folder(folder: str, key: str, owned: Callable[[str], bool], what: str,
                        reuse: str = "which is replaced whole", required: tuple[str, ...] = ()) -> None:
    """Refuse to replace ``folder`` unless it does not exist (and can be created: the nearest folder
    above it that exists is a writable folder), is empty, or holds only files that ``owned`` accepts
    and every name in ``required`` (``what`` written earlier by the same command, ``reuse`` saying
    what becomes of it), so that an output path mistyped as a run's folder, a checkpoint, a home
    folder or another folder of the same file names (a tokenizer's, beside an export) is never deleted.

    Raises ValueError naming ``key`` (the option that named the folder), the folder and the entries
    it holds besides ``what``. Cheap: call it before the work whose result goes there."""
    expected = f"expected a new or empty folder, or {what} written earlier"
    problem = output_folder_problem(folder, key)
    if problem:
        raise ValueError(f"{problem}; {expected}")
    entries = os.listdir(folder) if os.path.isdir(folder) else []
    foreign = sorted(name for name in entries if not owned(name))
    if foreign:
        shown = ", ".join(map(repr, foreign[:5])) + (f" and {len(foreign) - 5} more" if len(foreign) > 5 else "")
        raise ValueError(f"{key}: {folder!r} holds {shown}, which are not part of {what}; nothing was written "
                         f"({expected}, {reuse})")
    missing = sorted(set(required) - set(entries)) if entries else []
    if missing:
        raise ValueError(f"{key}: {folder!r} holds {sorted(entries)} but not {missing}, so it is not {what}; "
                         f"nothing was written ({expected}, {reuse})")


def check_output_files(folder: str, key: str, names: tuple[str, ...]) -> None:
    """ValueError naming ``key`` (the option that named ``folder``) when one of ``names``, the files a
    command writes whole into ``folder``, is there as a folder (or another non-file): the rename
    over it would fail only after the work. Cheap: call it before that work."""
    for name in names:
        path = os.path.join(folder, name)
        if os.path.lexists(path) and not os.path.isfile(path):
            raise ValueError(f"{key}: {path!r} is a folder or another non-file; expected a file of that name there, or "
                             "none; nothing was written")


def fsync_path(path: str) -> None:
    """fsync the file or folder ``path`` (a folder: so that a rename in it is on disk)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _fsync_tree(folder: str) -> None:
    """fsync every file under ``folder`` and the folders themselves, so a rename publishes data on disk."""
    for root, _, files in os.walk(folder):
        for path in [os.path.join(root, name) for name in files] + [root]:
            fsync_path(path)


def _swap_in(stage: str, final: str, old: str) -> None:
    """Rename ``stage`` to ``final``, moving an existing ``final`` to ``old`` first (and back if that fails)."""
    moved = os.path.exists(final)
    if moved:
        os.rename(final, old)
    try:
        os.rename(stage, final)
    except BaseException:
        if moved:
            os.rename(old, final)
        raise
    fsync_path(os.path.dirname(final) or ".")


@contextmanager
def replaced_folder(folder: str, key: str, owned: Callable[[str], bool], what: str,
                    required: tuple[str, ...] = ()) -> Iterator[str]:
    """Write ``folder`` whole: yields a new empty folder beside it (``.<name>.partial-<unique>``) to
    write into. When the block ends without error, the new folder replaces ``folder`` by two renames
    (the old one, if any, first moves to ``.<name>.partial-<unique>.old`` and is then deleted), so
    ``folder`` only ever holds the old files or all new ones; on an error the new folder is deleted
    and ``folder`` stays as it was. ``folder`` must pass :func:`check_output_folder` (``key``,
    ``owned``, ``what``, ``required``) before and after. A process killed in between leaves its hidden
    folders."""
    check_output_folder(folder, key, owned, what, required=required)
    final = os.path.normpath(folder)
    parent, name = os.path.dirname(final) or ".", os.path.basename(final)
    os.makedirs(parent, exist_ok=True)
    stage = os.path.join(parent, f".{name}.partial-{os.getpid()}-{time.time_ns()}")  # unique: never another's
    old = f"{stage}.old"
    os.mkdir(stage)
    try:
        yield stage
        _fsync_tree(stage)
        check_output_folder(final, key, owned, what, required=required)
        _swap_in(stage, final, old)
    except BaseException:
        shutil.rmtree(stage, ignore_errors=True)
        raise
    shutil.rmtree(old, ignore_errors=True)


def saved_shapes(checkpoint_dir: str) -> Shapes:
    """Name -> shape of every tensor saved in the DCP checkpoint ``checkpoint_dir`` (metadata only).

    Raises ValueError naming the path when the folder is missing, has no ``.metadata`` (listing
    the complete ``step-N`` folders inside it, if any) or its metadata cannot be read.
    """
    if not os.path.isdir(checkpoint_dir):
        raise ValueError(f"{checkpoint_dir!r} is not a directory; expected a DCP checkpoint folder "
                         "<dump>/checkpoint/step-N")
    if not os.path.isfile(os.path.join(checkpoint_dir, METADATA_FILE)):
        inside = complete_steps(checkpoint_dir)
        hint = f"; it holds checkpoints {', '.join(f'step-{s}' for s in inside)}: pass one of them" if inside else ""
        raise ValueError(f"{checkpoint_dir!r} has no DCP {METADATA_FILE} file (not a checkpoint, or an "
                         f"incomplete save){hint}")
    try:
        entries = FileSystemReader(checkpoint_dir).read_metadata().state_dict_metadata
    except Exception as exc:  # a truncated or foreign file: unpickling can raise nearly anything
        raise ValueError(f"{checkpoint_dir!r}: cannot read its DCP metadata ({type(exc).__name__}: {exc})") from None
    return {name: tuple(entry.size) for name, entry in entries.items() if isinstance(entry, TensorStorageMetadata)}


def model_weights(shapes: Shapes) -> Shapes:
    """``shapes`` without TorchTitan's training states (optimizer, lr schedule, data loader, step)."""
    return {name: shape for name, shape in shapes.items() if name.split(".", 1)[0] not in TRAINING_STATES}


def state_shapes(state: dict[str, torch.Tensor]) -> Shapes:
    """Name -> shape of a state dict (meta, local or sharded DTensor: the global shape)."""
    return {name: tuple(value.shape) for name, value in state.items()}


class Mismatch(NamedTuple):
    """One weight that differs: its name and its shape in the checkpoint and in the model (None: absent)."""

    name: str
    saved: tuple[int, ...] | None
    expected: tuple[int, ...] | None


def weight_mismatches(saved: Shapes, expected: Shapes) -> list[Mismatch]:
    """Model weights that differ between a checkpoint and a model, both ways.

    saved: the checkpoint's tensors (:func:`saved_shapes`; training states are ignored).
    expected: the model's weights (:func:`state_shapes`). Returns the weights the model has and the
    checkpoint lacks or holds in another shape, in the model's order, then the checkpoint's
    weights the model lacks, in the checkpoint's order. dtypes are not compared.
    """
    weights = model_weights(saved)
    differing = [Mismatch(name, weights.get(name), shape) for name, shape in expected.items()
                 if weights.get(name) != shape]
    return differing + [Mismatch(name, shape, None) for name, shape in weights.items() if name not in expected]


def _shape(shape: tuple[int, ...] | None) -> str:
    return "absent" if shape is None else str(tuple(shape))


def describe(mismatches: list[Mismatch]) -> str:
    """``layers.2.attention.wq.weight: checkpoint (256, 256), model absent (8 weights differ)``."""
    first = mismatches[0]
    count = f" ({len(mismatches)} weights differ)" if len(mismatches) > 1 else ""
    return f"{first.name}: checkpoint {_shape(first.saved)}, model {_shape(first.expected)}{count}"

