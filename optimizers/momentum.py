"""The Muon family's momentum step, eager or compiled into a few fused kernels.

    B <- mu B + G                     (kept as it was when the step is skipped)
    U = G + mu B  (Nesterov)  or  B,  written in the orthogonaliser's dtype

Eager, this is three foreach passes over fp32 data and a cast per matrix. On CUDA the same
arithmetic goes through ``torch.compile`` with Inductor's combo kernels, which read B and G once
and write B and U once for many matrices per launch; the first call compiles (tens of seconds),
and any failure to compile falls back to the eager path for good, with a warning. The compiled
kernels may contract ``mu * B + G`` into one fused multiply-add, so their B can differ from the
eager one in the last bit.
"""

from __future__ import annotations

import logging

import torch

from .skip_step import SkipStep

__all__ = ["momentum_updates"]

log = logging.getLogger(__name__)


def _eager(bufs, grads, mu, nesterov, dtype, skip: SkipStep):
    if skip.active:
        new = torch._foreach_mul(bufs, mu)
        torch._foreach_add_(new, grads)
        skip.select_(bufs, new)
    else:
        torch._foreach_mul_(bufs, mu)
        torch._foreach_add_(bufs, grads)
        new = bufs
    if dtype == grads[0].dtype:
        return torch._foreach_add(grads, new, alpha=mu) if nesterov else list(new)
    # U straight in the orthogonaliser's dtype (it casts to it first): computed in fp32 and rounded
    # once, as that cast would, with half the bytes written and no cast pass
    return [torch.add(g, b, alpha=mu, out=torch.empty_like(g, dtype=dtype)) if nesterov else b.to(dtype)
            for g, b in zip(grads, new)]


def _graph(bufs, grads, mu, nesterov, dtype, flag):
    """The momentum step as one traceable function (``flag``: the skip flag or None)."""
    out = []
    for b, g in zip(bufs, grads):
        new = b * mu + g
        b.copy_(new if flag is None else torch.where(flag, b, new))
        out.append((g + mu * new if nesterov else new).to(dtype))
    return out


class _Compiled:
    """``_graph`` compiled once per process; ``failed`` after a compile error (then eager)."""

    fn = None
    failed = False

    @classmethod
    def run(cls, *args):
        if cls.fn is None:
            cls.fn = torch.compile(_graph, dynamic=False, fullgraph=True, options={"combo_kernels": True})
        return cls.fn(*args)


def momentum_updates(bufs: list[torch.Tensor], grads: list[torch.Tensor], mu: float, nesterov: bool,
                     dtype: torch.dtype, skip: SkipStep, compiled: bool = True) -> list[torch.Tensor]:
    """Advance the momentum buffers in place and return the updates U.

    Args:
        bufs, grads: per matrix, the momentum buffer and the gradient (local pieces, one device).
        mu, nesterov: momentum coefficient and Nesterov's form.
        dtype: dtype of the returned updates (the orthogonaliser's compute dtype).
        skip: the step's ``SkipStep``: when its flag is set the buffers keep every bit.
        compiled: use the compiled kernels (CUDA only; the CPU always runs eagerly).
    Returns:
        the updates, one per matrix, in ``dtype``.
    """
    if compiled and bufs[0].is_cuda and not _Compiled.failed:
        try:
            return _Compiled.run(bufs, grads, mu, nesterov, dtype, skip.flag)
        except Exception as e:  # a compile error leaves the buffers untouched: run eagerly from now on
            _Compiled.failed = True
            log.warning("momentum_updates: torch.compile failed (%s: %s); using the eager momentum step",
                        type(e).__name__, str(e)[:200])
    return _eager(bufs, grads, mu, nesterov, dtype, skip)
