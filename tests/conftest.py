"""Test isolation: each test starts with dynamo's caches empty.

Blocks of different models share one code object (``Block.forward``), so the compiles of earlier
tests would count against dynamo's recompile limit (8 per code object; with ``fullgraph=True``
reaching it is an error) and would have made sizes and float attributes dynamic.
"""

import pytest
import torch


@pytest.fixture(autouse=True)
def _fresh_dynamo():
    yield
    torch._dynamo.reset()
