"""Every shipped config parses, passes validation and builds its model; generated ones are current."""

from __future__ import annotations

import glob
import os
import subprocess
import sys
import tomllib

import pytest
import torch

from parallax_titan.config import JobConfig, load_config
from parallax_titan.config.schema import toml_problems
from parallax_titan.mixers import FLA_MIXERS
from parallax_titan.model import ParallaxQwen3Model
from parallax_titan.spec import model_args_for, register_all
from torchtitan.protocols.train_spec import get_train_spec

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# configs/mad holds MAD grids (eval.mad's own schema), not training jobs.
CONFIGS = sorted(p for p in glob.glob(os.path.join(REPO, "configs", "**", "*.toml"), recursive=True)
                 if os.sep + "mad" + os.sep not in p)
register_all()


def test_generated_configs_are_current():
    result = subprocess.run([sys.executable, "-m", "scripts.make_configs", "--check"], cwd=REPO,
                            capture_output=True, text=True)
    assert result.returncode == 0, result.stdout


def test_paper_configs_cover_every_variant_and_recipe():
    names = {os.path.relpath(p, REPO) for p in CONFIGS}
    for flavor in ("0.6B", "1.7B"):
        for variant in ("transformer", "transformer_dagger", "parallax", "parallax_norope", "parallax_dagger"):
            for recipe in ("muon_wsd", "adamw_wsd", "adamw_cosine"):
                assert f"configs/paper/{flavor}/{variant}_{recipe}.toml" in names


@pytest.mark.parametrize("path", CONFIGS, ids=[os.path.relpath(p, REPO) for p in CONFIGS])
def test_config_parses_validates_and_builds(path):
    with open(path, "rb") as f:
        data = tomllib.load(f)
    assert toml_problems(data, JobConfig) == []
    if data["model"]["name"] in FLA_MIXERS:
        pytest.importorskip("fla.layers")
    # a config for local data names its files on the command line (configs/test_cpu_2rank.toml)
    data_args = ["--training.dataset", "default_corpus"] if data["training"]["dataset"] == "local" else []
    cfg = load_config(["--job.config_file", path, *data_args])  # validates every section
    assert cfg.model.flavor in get_train_spec(cfg.model.name).model_args  # registered with TorchTitan
    args = model_args_for(cfg)
    with torch.device("meta"):
        model = ParallaxQwen3Model(args)
    assert sum(p.numel() for p in model.parameters()) > 0
    assert (args.mixer == "parallax") == cfg.model.name.startswith("parallax")
    if cfg.model.name.startswith("parallax"):
        assert model.layers["0"].attention.rho_rope == cfg.parallax.rho_rope
        assert model.layers["0"].attention.fused_norm_rope == cfg.parallax.fused_norm_rope


@pytest.mark.parametrize("key", ["fused_norm_rope", "hopper_kernels"])
@pytest.mark.parametrize("off", [False, True])
def test_kernel_switches_reach_every_attention_module(key, off):
    """``[parallax] fused_norm_rope`` and ``hopper_kernels`` (default true) set every Parallax layer's
    switch of that name."""
    cfg = load_config(["--job.config_file", "configs/demo_cpu.toml", *([f"--parallax.no-{key}"] if off else [])])
    assert getattr(cfg.parallax, key) is (not off)
    with torch.device("meta"):
        model = ParallaxQwen3Model(model_args_for(cfg))
    assert [getattr(layer.attention, key) for layer in model.layers.values()] == [not off] * len(model.layers)
