"""Command-line tools of Parallax-Titan, each run from the repository root as ``python -m scripts.<name>``:
``analyze``, ``export_hf``, ``get_tokenizer``, ``build_corpus``, ``build_tiny_tokenizer``, ``make_configs``;
the benchmarks are in :mod:`scripts.bench`. Nothing here is imported by the training code."""
