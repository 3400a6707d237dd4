"""The end of a distributed run: every rank destroys its process groups, then waits for the others.

A process that exits straight after ``destroy_process_group`` sometimes dies in C++ teardown on
torch 2.13 with gloo ("terminate called without an active exception", SIGABRT): the groups, still
referenced by a device mesh, are freed during interpreter finalization. A run that trained and saved
everything then fails with exit code -6. Waiting on the group's key-value store, which outlives the
group, until every rank has destroyed its own groups removed it in every run measured
(docs/CHANGELOG.md, 2026-12-03)."""

from __future__ import annotations

import datetime
import logging

import torch.distributed as dist

logger = logging.getLogger(__name__)

LEFT_KEY = "parallax_titan/left"
ALL_LEFT_KEY = "parallax_titan/all_left"


def leave_process_group(wait_s: float) -> None:
    """Destroy the default process group and its subgroups; then, with more than one rank, wait up to
    ``wait_s`` seconds for every rank to have done the same (a warning names what is missing when
    the wait ends first). A no-op when no process group is initialised."""
    if not dist.is_initialized():
        return
    rank, world = dist.get_rank(), dist.get_world_size()
    store = dist.distributed_c10d._get_default_store()  # the group's store; no public accessor
    dist.destroy_process_group()
    if world == 1:
        return
    try:
        if store.add(LEFT_KEY, 1) == world:
            store.set(ALL_LEFT_KEY, "1")
        store.wait([ALL_LEFT_KEY], datetime.timedelta(seconds=wait_s))
    except RuntimeError as exc:  # timed out (a peer died), or the store's host already left
        logger.warning(f"rank {rank}: not every rank of {world} left the process group within {wait_s} s "
                       f"({type(exc).__name__}: {exc}); exiting anyway")
