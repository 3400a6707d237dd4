"""Which aten ops code runs (test helper), in order, as ``str(op)`` (e.g. ``"aten.clone.default"``):
``with AtenOps() as mode: ...`` then ``mode.ops``, or ``recorded_ops(call)``."""

from __future__ import annotations

from torch.utils._python_dispatch import TorchDispatchMode


class AtenOps(TorchDispatchMode):
    """Records the aten ops run inside it."""

    def __init__(self):
        super().__init__()
        self.ops = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.ops.append(str(func))
        return func(*args, **(kwargs or {}))


def recorded_ops(call) -> list[str]:
    """The aten ops ``call()`` runs, in order."""
    with AtenOps() as mode:
        call()
    return mode.ops
