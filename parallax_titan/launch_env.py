"""Environment defaults of every training launcher (train.py, scripts/titan_reference.py).

Call ``set_defaults()`` before torch is imported; a user's own setting wins. Expandable segments:
the caching allocator grows segments instead of calling cudaMalloc for new block sizes
(TorchTitan's launcher sets the same; in a 2-GPU 0.6B profile ~16 ms per step of GPU idle sat in
allocations inside the optimizer step). Tokenizer threads off: the data loader process is forked
after the tokenizer was used.
"""

import os

DEFAULTS = {"PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True", "TOKENIZERS_PARALLELISM": "false"}


def set_defaults() -> None:
    """Set each of ``DEFAULTS`` that the environment does not already set."""
    for name, value in DEFAULTS.items():
        os.environ.setdefault(name, value)
