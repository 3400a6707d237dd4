"""What the kernels' Triton launchers share: the device a launch runs on, CUDA's limits on a launch
grid, and the choice between 32- and 64-bit element offsets."""

from __future__ import annotations

import contextlib

import torch

# CUDA's limits on a launch grid's dims x, y and z: launchers put batch x heads (and any other size a
# caller chooses) in x, or launch in chunks that fit.
MAX_GRID = (2 ** 31 - 1, 65535, 65535)
# An offset computed in int32 wraps from here on.
WIDE_OFFSETS_FROM = 2 ** 31


def on_device(device: torch.device):
    """The context to launch Triton kernels on tensors of ``device`` in: triton launches on the current
    CUDA device's stream, so for a CUDA device other than the current one ``torch.cuda.device(device)``;
    otherwise (the current device, or the CPU under the interpreter) a context that does nothing, so
    the usual call pays one device query and no switch."""
    if device.type != "cuda" or device.index in (None, torch.cuda.current_device()):
        return contextlib.nullcontext()
    return torch.cuda.device(device)


def wide_offsets(*extents: int) -> bool:
    """Whether a kernel needs its 64-bit offsets variant (the ``WIDE`` constexpr): some offset it
    computes in int32, bounded by one of ``extents`` in elements (a tensor's heads times its head
    stride, say), reaches 2^31. Chosen per call, so the usual calls compile the 32-bit code."""
    return max(extents) >= WIDE_OFFSETS_FROM
