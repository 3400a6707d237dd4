"""Per-step flags that every rank agrees on, read on the host without a host barrier."""

from __future__ import annotations

import torch
import torch.distributed as dist


class StepFlags:
    """Max-reduces a small flag tensor across ranks on the device and copies it to the host.

    :meth:`agree` queues the all-reduce (nothing on one rank) and an asynchronous copy into pinned
    host memory; :meth:`read` waits for that copy only, so work queued after :meth:`agree` keeps
    the GPU busy while the host waits, and no rank's host waits for another rank's host (a gloo
    all-reduce of host values would make them meet every step). CPU tensors are read directly.
    """

    def __init__(self) -> None:
        self._multi = dist.is_initialized() and dist.get_world_size() > 1
        self._pinned: torch.Tensor | None = None
        self._pending: tuple[torch.Tensor, torch.cuda.Event | None] | None = None

    def agree(self, flags: torch.Tensor) -> torch.Tensor:
        """Flags (any shape; nonzero = set) set on any rank, as a bool device tensor of that shape."""
        agreed = flags.float()
        if self._multi:
            dist.all_reduce(agreed, op=dist.ReduceOp.MAX)
        if not agreed.is_cuda:
            self._pending = (agreed, None)
            return agreed > 0
        if self._pinned is None or self._pinned.shape != agreed.shape:
            self._pinned = torch.empty(agreed.shape, dtype=agreed.dtype, pin_memory=True)
        self._pinned.copy_(agreed, non_blocking=True)
        event = torch.cuda.Event()
        event.record()
        self._pending = (self._pinned, event)
        return agreed > 0

    def read(self) -> torch.Tensor:
        """The host copy of the last :meth:`agree`'s flags as a bool tensor (waits for that copy)."""
        if self._pending is None:
            raise RuntimeError("StepFlags.read: no flags were agreed on since the last read")
        host, event = self._pending
        if event is not None:
            event.synchronize()
        self._pending = None
        return host > 0
