"""``[diagnostics]``: periodic attention and spectral diagnostics during training.

Defined without ``from __future__ import annotations`` so tyro sees real types;
:class:`parallax_titan.config.JobConfig` holds it as ``diagnostics``.
"""

import math
from dataclasses import dataclass

from parallax_titan.config.schema import value_problems


@dataclass
class Diagnostics:
    """``[diagnostics]``: every ``freq`` steps, a separate no-grad forward of a fixed held-out batch
    collects per-layer attention statistics (SPEC section 1) and weight/circuit spectra (SPEC
    section 3) and logs them as ``diag/...`` scalars. Off by default; when off nothing runs."""

    enable: bool = False
    """Run the diagnostics pass (training outputs are unaffected either way)."""

    freq: int = 500
    """Run after every ``freq``-th training step (and never at other steps)."""

    batch_size: int = 1
    """Rows of the fixed held-out batch (the same rows on every rank)."""

    seq_len: int = 0
    """Tokens per row, at least 2; 0 means ``training.seq_len``. Must not exceed ``training.seq_len`` (RoPE cache)."""

    dataset: str = ""
    """Dataset of the held-out batch; empty means ``[validation]`` data when validation is enabled,
    else the embedded ``default_corpus_validation``."""

    dataset_path: str = ""
    """Path for ``dataset`` (empty: the dataset's default path)."""

    max_queries: int = 64
    """Query positions per row and head (evenly spaced) at which the D x D covariances behind CPA and
    ||Corr||_F are formed; bounds their cost (B * H * max_queries * L * D^2 per layer)."""

    corr_ridge: float = 1e-3
    """Ridge added to Sigma_KK and Sigma_VV before the inverse square roots of Corr, relative to
    their mean eigenvalue (trace / D): covariances of a few attended tokens are singular."""

    spectral: bool = True
    """Also compute the spectral metrics of W_Q, W_K, W_V, W_O, W_R, the MLP matrices and the per-head
    circuits W_QK, W_OV, W_RK (gathers every weight: collective under FSDP)."""

    spectral_freq: int = 0
    """Spectral metrics every ``spectral_freq`` steps (a multiple of ``freq``); 0 means every pass."""

    top_k: int = 8
    """k of the top-k energy metric (fraction of sum sigma^2 in the k largest modes)."""

    cka_tokens: int = 1024
    """Tokens (fixed Gaussian inputs and sampled real inputs) for the cross-head CKA of V outputs."""

    figures: bool = True
    """Log depth-profile figures (``diag/depth/<metric>``) to TensorBoard as images when a writer is given."""

    def validate(self) -> list[str]:
        """Every bad key of the section; ``seq_len`` against ``training.seq_len`` is checked by the job."""
        problems = value_problems(self, "diagnostics")
        if problems:  # a value of the wrong type (set in code) cannot be compared below
            return problems
        checks = [
            ("freq", self.freq >= 1, ">= 1"),
            ("batch_size", self.batch_size >= 1, ">= 1"),
            # one token: no query reads two keys, so CPA and Corr would never be formed
            ("seq_len", self.seq_len == 0 or self.seq_len >= 2, "0 (training.seq_len) or >= 2"),
            ("max_queries", self.max_queries >= 1, ">= 1"),
            ("corr_ridge", math.isfinite(self.corr_ridge) and self.corr_ridge >= 0, "a finite number >= 0"),
            ("spectral_freq", self.spectral_freq >= 0 and self.spectral_freq % max(1, self.freq) == 0,
             f"0 or a multiple of diagnostics.freq = {self.freq}"),
            ("top_k", self.top_k >= 1, ">= 1"),
            ("cka_tokens", self.cka_tokens >= 2, ">= 2"),
        ]
        problems = [f"diagnostics.{key}: expected {expected}, got {getattr(self, key)!r}"
                    for key, ok, expected in checks if not ok]
        if self.dataset_path and not self.dataset:  # resolve_dataset would read another dataset
            problems.append(f"diagnostics.dataset_path: {self.dataset_path!r} is set but diagnostics.dataset is "
                            "empty, so the held-out batch would come from the validation data or the embedded "
                            "corpus; set diagnostics.dataset to the path's dataset (e.g. 'local')")
        return problems
