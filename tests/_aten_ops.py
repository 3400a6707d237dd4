"""Which aten ops a call runs (test helper): ``recorded_ops(call)``, in order, as ``str(op)``
(e.g. ``"aten.clone.default"``)."""

from __future__ import annotations

from torch.utils._python_dispatch import TorchDispatchMode


class _Ops(TorchDispatchMode):
    """Records the aten ops run inside it."""

    def __init__(self):
        super().__init__()
        self.ops = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.ops.append(str(func))
        return func(*args, **(kwargs or {}))


def recorded_ops(call) -> list[str]:
    """The aten ops ``call()`` runs, in order."""
    with _Ops() as mode:
        call()
    return mode.ops
