"""Environment defaults of every training launcher (train.py, scripts.bench.titan_reference).

Call ``set_defaults()`` before torch is imported; a user's own setting wins. Expandable segments:
the caching allocator grows segments instead of calling cudaMalloc for new block sizes, which
otherwise leaves the GPU idle during allocations inside the optimizer step (TorchTitan's launcher
sets the same). Tokenizer threads off: the data loader process is forked after the tokenizer was used.
"""

import os

DEFAULTS = {"PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True", "TOKENIZERS_PARALLELISM": "false"}


def set_defaults() -> None:
    """Set each of ``DEFAULTS`` that the environment does not already set."""
    for name, value in DEFAULTS.items():
        os.environ.setdefault(name, value)
