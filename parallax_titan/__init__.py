"""Parallax-Titan: Qwen3 with Parallax attention on TorchTitan.

``parallax_titan.spec.register_all()`` registers the model variants (``transformer``,
``transformer_dagger``, ``parallax``, ``parallax_dagger``) with TorchTitan; ``train.py`` calls it.
"""
