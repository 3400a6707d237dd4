"""Checks of ``cu_seqlens``, the packed-document offsets of ``kernels.parallax_attention``.

Valid offsets are a 1-D int32 tensor on q's device, ``[0, ..., B * L]`` (B == 1), non-decreasing
(empty documents allowed). The fused kernels index K/V tiles with them, so bad values give wrong
results, NaN or out-of-bounds reads: every call checks them, before any kernel runs.

Cost of the value check (``check_values``):

* eager (the usual case): one device-to-host copy of the offsets, which waits for the work
  queued before it (a host sync). A tensor that passed is remembered (by identity, with its
  in-place version counter), so the layers of one step that share one ``cu_seqlens`` tensor sync
  once; a tensor written in place is checked again. The model builds cu_seqlens with
  ``torch.nonzero``, which syncs already, so the one extra copy costs microseconds.
  (Writes that bypass the version counter, e.g. through ``.data`` or a raw kernel, are not seen.)
* under CUDA-graph capture, or while ``torch.compile`` traces the call: the host cannot read the
  values (they change between replays), so the check runs on the device: a few tiny kernels and
  ``torch._assert_async``, no sync. Bad offsets then fail as a device-side assertion, which ends
  the CUDA context (CUDA's message, not the one below; the process must restart) and no result
  is returned. The fused path checks inside its custom op, so compiled blocks still check on the
  host in eager execution.
"""

from __future__ import annotations

import torch
from torch.utils.weak import WeakIdKeyDictionary

_validated = WeakIdKeyDictionary()  # tensor -> (its _version, packed length) when it passed
_SHOWN = 12  # entries shown at each end of a long offsets list


def check_structure(cu_seqlens, q: torch.Tensor) -> None:
    """Type, dtype, shape and device of cu_seqlens for q (B, L, Hq, D); no host sync. ValueError."""
    if not isinstance(cu_seqlens, torch.Tensor) or cu_seqlens.dtype != torch.int32 or cu_seqlens.dim() != 1:
        desc = (f"{cu_seqlens.dtype} tensor of shape {tuple(cu_seqlens.shape)}"
                if isinstance(cu_seqlens, torch.Tensor) else type(cu_seqlens).__name__)
        raise ValueError(f"parallax_attention: cu_seqlens must be a 1-D int32 tensor, got {desc}")
    if cu_seqlens.numel() < 2:
        raise ValueError(f"parallax_attention: cu_seqlens needs at least 2 entries, got {cu_seqlens.numel()}")
    if q.shape[0] != 1:
        raise ValueError(f"parallax_attention: cu_seqlens requires batch == 1 (packed documents), got batch={q.shape[0]}")
    if cu_seqlens.device != q.device:
        raise ValueError(f"parallax_attention: cu_seqlens is on {cu_seqlens.device}, q on {q.device}")


def check_values(cu_seqlens: torch.Tensor, total: int) -> None:
    """Raise ValueError naming the offending entries unless cu_seqlens (structurally valid) starts
    at 0, never decreases and ends at ``total`` (= B * L). See the module docstring for the cost."""
    if _on_device_only(cu_seqlens):
        ok = (cu_seqlens[0] == 0) & (cu_seqlens[-1] == total) & (cu_seqlens[1:] >= cu_seqlens[:-1]).all()
        torch._assert_async(ok, f"parallax_attention: cu_seqlens must start at 0, be non-decreasing and end "
                                f"at seq={total}")
        return
    stamp = _stamp(cu_seqlens, total)
    if stamp is not None and _validated.get(cu_seqlens) == stamp:
        return
    values = cu_seqlens.tolist()
    problem = _problem(values, total)
    if problem:
        raise ValueError(f"parallax_attention: cu_seqlens={_show(values)} is invalid: {problem}; the offsets must "
                         f"start at 0, be non-decreasing and end at seq={total}")
    if stamp is not None:
        _validated[cu_seqlens] = stamp


def _problem(values, total):
    """The first problem of offsets ``values`` for a packed length ``total``, or "" when valid."""
    if values[0] != 0:
        return f"cu_seqlens[0]={values[0]}, expected 0"
    for i, x in enumerate(values):
        if x < 0 or x > total:
            return f"cu_seqlens[{i}]={x} lies outside [0, seq={total}]"
    for i in range(1, len(values)):
        if values[i] < values[i - 1]:
            return f"cu_seqlens[{i}]={values[i]} < cu_seqlens[{i - 1}]={values[i - 1]} (decreasing)"
    if values[-1] != total:
        return f"cu_seqlens[-1]={values[-1]}, expected seq={total}"
    return ""


def _stamp(cu_seqlens, total):
    """(in-place version, total) of a checked tensor; None for inference-mode tensors, which keep
    no version counter (they are checked on every call)."""
    if cu_seqlens.is_inference():
        return None
    return cu_seqlens._version, total


def _on_device_only(cu_seqlens):
    """Whether the values cannot be read on the host now (graph capture, or compile tracing)."""
    if torch.compiler.is_compiling():
        return True
    return cu_seqlens.is_cuda and torch.cuda.is_current_stream_capturing()


def _show(values):
    if len(values) <= 2 * _SHOWN:
        return str(values)
    return f"[{str(values[:_SHOWN])[1:-1]}, ..., {str(values[-_SHOWN:])[1:-1]}] ({len(values)} entries)"
