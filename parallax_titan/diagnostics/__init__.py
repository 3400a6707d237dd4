"""Diagnostics and spectral analysis (SPEC sections 1 and 3).

* :mod:`.attention`: COR, CPA, ||Corr||_F, probe norm, score range, sinks, entropy from q, r, k, v.
* :mod:`.spectral`: stable rank, eRank, output-energy eRank, top-k energy, normalised spectral
  entropy, circuit singular values, linear CKA.
* :mod:`.weights`: per-layer projections, per-head circuits W_QK, W_OV, W_RK and their spectra.
* :mod:`.capture`: temporary forward pre-hooks that read q, r, k, v during a model's forward.
* :mod:`.runner`: :class:`DiagnosticsRunner` for the trainer (``[diagnostics]`` in TOML, see
  :class:`Diagnostics`), :func:`collect` for one pass.
* :mod:`.plots` and :mod:`.report`: figures and the markdown report of ``scripts/analyze.py``.
"""

from parallax_titan.config.diagnostics import Diagnostics
from parallax_titan.diagnostics.runner import (
    DiagnosticsResult,
    DiagnosticsRunner,
    collect,
    tensorboard_figure_logger,
)

__all__ = [
    "Diagnostics", "DiagnosticsResult", "DiagnosticsRunner", "collect", "tensorboard_figure_logger",
]
