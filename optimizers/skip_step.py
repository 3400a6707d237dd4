"""Skipping an optimizer step on the device: the one place where a skipped step is decided.

``MuonAdamW.step(skip=flag)`` takes the decision as a 0-dim device tensor and hands it to
``SkipStep``; every write the step makes to a parameter or to optimizer state goes through one of
this class's methods, which are exact identities when the flag is set and today's arithmetic when
it is not.
"""

from __future__ import annotations

from collections import defaultdict

import torch

__all__ = ["SkipStep"]

# dtypes whose foreach kernels read a same-dtype 0-dim tensor exactly as they read a Python scalar
# (the scalar is rounded once to the dtype in both cases); for others the kernels compute with the
# Python scalar in fp32 but with the tensor in the storage dtype
_EXACT_TENSOR_SCALAR = (torch.float32, torch.float64)


class SkipStep:
    """Whether this step's update is skipped, as a device tensor that the host never reads.

    The caller decides (a non-finite loss or gradient, say) and passes ``skip``: a 0-dim bool or
    float tensor on the parameters' device, nonzero to skip, the same on every rank (all-reduce it
    with MAX first). The optimizer then issues the same kernels either way and masks their writes:

    - state and parameters written from a fresh value are selected: ``torch.where(skip, old, new)``;
    - decay factors become ``where(skip, 1, factor)`` (``1 * x == x`` bit for bit);
    - full-matrix terms (orthogonalised updates, S_p) are replaced by zeros, so each delta is
      ``coeff * 0 = -0.0`` (the coefficients are negative) and ``x + (-0.0) == x`` for every ``x``,
      ``-0.0`` included;
    - Adam gets ``found_inf`` (its fused kernel then writes nothing) and its step counts advance by
      ``1 - skip``.

    Non-finite gradients only reach arithmetic whose result is discarded by a select.

    Why not read the flag on the host and return early, as OLMo-core's ``SkipStepOptimizer`` would
    accept: reading a device value makes the host wait until the backward, the gradient
    reduce-scatter and the clipping have run, and the GPU then idles while the host issues the
    optimizer's few hundred kernels. Masked writes cost a few elementwise kernels per step and keep
    the host a step ahead; a skipped step still costs a full step of device time, which is rare.
    """

    def __init__(self, skip: torch.Tensor | None) -> None:
        if skip is not None:
            if not isinstance(skip, torch.Tensor) or skip.ndim != 0:
                got = tuple(skip.shape) if isinstance(skip, torch.Tensor) else type(skip).__name__
                raise ValueError(f"step: skip must be a 0-dim tensor (bool or float) or None; got {got}")
            if not (skip.dtype == torch.bool or skip.is_floating_point()):
                raise ValueError(f"step: skip has dtype {skip.dtype}; expected torch.bool or a float dtype")
        self.flag = None if skip is None else (skip if skip.dtype == torch.bool else skip != 0)
        self._found_inf: dict = {}

    @property
    def active(self) -> bool:
        """True when a flag was given (the step may be skipped), False for ``skip=None``."""
        return self.flag is not None

    def check_device(self, device: torch.device) -> None:
        """Raise unless the flag lives on ``device`` (a flag elsewhere would need a copy per kernel)."""
        if self.flag is not None and self.flag.device != torch.device(device):
            raise ValueError(f"step: skip is on {self.flag.device}; expected the parameters' device {device}")

    def found_inf(self, device: torch.device) -> torch.Tensor | None:
        """fp32 1.0 (skip) / 0.0 on ``device``, the form ``torch._fused_adamw_`` reads; None without a flag."""
        if self.flag is None:
            return None
        if device not in self._found_inf:
            self._found_inf[device] = self.flag.to(device=device, dtype=torch.float32)
        return self._found_inf[device]

    def pick(self, old: torch.Tensor, new: torch.Tensor) -> torch.Tensor:
        """``old`` when skipped, else ``new`` (``new`` itself without a flag)."""
        return new if self.flag is None else torch.where(self.flag, old, new)

    def select_(self, olds: list[torch.Tensor], news: list[torch.Tensor]) -> None:
        """``olds[i] <- news[i]`` unless skipped (one copy kernel for all without a flag)."""
        if self.flag is None:
            torch._foreach_copy_(olds, news)
            return
        for old, new in zip(olds, news):  # no foreach select exists: a where per tensor
            torch.where(self.flag, old, new, out=old)

    def scale_(self, tensors: list[torch.Tensor], factor: float) -> None:
        """``t *= factor`` for every tensor unless skipped; no kernel when ``factor == 1``."""
        if factor == 1.0 or not tensors:
            return
        if self.flag is None:
            torch._foreach_mul_(tensors, factor)
            return
        by_dtype: dict = defaultdict(list)
        for t in tensors:
            by_dtype[t.dtype].append(t)
        for dtype, group in by_dtype.items():
            if dtype in _EXACT_TENSOR_SCALAR:
                value = torch.full((), factor, dtype=dtype, device=self.flag.device).masked_fill_(self.flag, 1.0)
                torch._foreach_mul_(group, value)
            else:
                for t in group:
                    torch.where(self.flag, t, t * factor, out=t)

    def advance_(self, counts: list[torch.Tensor]) -> None:
        """Step counts ``+= 1``, or ``+= 0`` when skipped (fp32 counts: integers stay exact)."""
        if self.flag is None:
            torch._foreach_add_(counts, 1.0)
            return
        keep = 1.0 - self.found_inf(counts[0].device)
        # a list of 0-dim tensors: the single-tensor overload synchronises on CUDA for 0-dim operands
        torch._foreach_add_(counts, [keep] * len(counts))

    def zero_if_skipped(self, t: torch.Tensor) -> torch.Tensor:
        """``t``, or zeros of its shape and dtype when skipped (``t`` itself without a flag)."""
        return t if self.flag is None else torch.where(self.flag, 0.0, t)
