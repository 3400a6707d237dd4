"""Downstream evaluation of Parallax-Titan checkpoints with lm-evaluation-harness.

``eval.ParallaxLM`` (lm-eval model ``parallax_titan``) scores any checkpoint of any variant;
``python -m eval.lm_eval`` runs the paper's suite and writes its table (docs/eval.md).
Attributes are imported lazily so ``eval.mad`` and ``eval.at_end`` do not pull in lm-eval.
"""

__all__ = ["ParallaxLM"]


def __getattr__(name):
    if name == "ParallaxLM":
        from eval.model import ParallaxLM

        return ParallaxLM
    raise AttributeError(f"module 'eval' has no attribute {name!r}")
