"""parallax_titan.compat.configure_for_host: on a machine without CUDA the run trains in fp32 without
compile, and says which configured values it changed (they were overwritten without a word)."""

from __future__ import annotations

import logging
from types import SimpleNamespace

import pytest
import torch

from parallax_titan.compat import configure_for_host


def job(param: str, dtype: str, compiled: bool) -> SimpleNamespace:
    return SimpleNamespace(training=SimpleNamespace(mixed_precision_param=param, dtype=dtype),
                           compile=SimpleNamespace(enable=compiled))


@pytest.mark.skipif(torch.cuda.is_available(), reason="the CPU host's changes")
def test_cpu_host_changes_are_logged_by_key(caplog):
    config = job("bfloat16", "float32", True)
    with caplog.at_level(logging.INFO):
        configure_for_host(config)
    assert (config.training.mixed_precision_param, config.training.dtype, config.compile.enable) == (
        "float32", "float32", False)
    assert ("no CUDA device: training on the CPU with training.mixed_precision_param = 'bfloat16' -> 'float32', "
            "compile.enable = True -> False") in caplog.text
    caplog.clear()
    with caplog.at_level(logging.INFO):
        configure_for_host(job("float32", "float32", False))  # nothing to change: nothing said
    assert "no CUDA device" not in caplog.text
