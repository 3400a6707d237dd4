"""configs/codesign carries seed 000's codesign grid: four optimizers x {softmax, Parallax} in the setting
of modded-NanoGPT's optimization track, with SPEC.md section 3's Muon recipe for every run.

The numbers are typed in from their sources (not read from scripts/make_configs.py): the track's
records/track_3_optimization/train_gpt_simple.py (GPT(num_layers=12, model_dim=768), head_dim=128,
batch_size = 8 * 64 * 1024 tokens of 1024-token sequences, train_steps = 3250, cooldown_frac = 0.7)
and SPEC.md section 3 (Muon lr 5e-3, wd 0.1, Adam (0.8, 0.95) eps 1e-7, multipliers embed 0.3, norms
0.015). Each file is loaded through ``load_config``, as a run would be.
"""

from __future__ import annotations

import glob
import os

import pytest

from parallax_titan.config import load_config
from parallax_titan.spec import model_args_for, register_all

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
register_all()

OPTIMIZERS = {"muon": "Muon", "normuon": "NorMuon", "aurora": "Aurora", "soap": "SOAP"}
FILES = {f"{variant}_{stem}": (variant, name) for variant in ("transformer", "parallax")
         for stem, name in OPTIMIZERS.items()}


def load(stem: str):
    return load_config(["--job.config_file", os.path.join(REPO, "configs", "codesign", f"{stem}.toml")],
                       check_data=False)


def test_the_grid_is_four_optimizers_by_two_attentions():
    found = {os.path.basename(p)[:-5] for p in glob.glob(os.path.join(REPO, "configs", "codesign", "*.toml"))}
    assert found == set(FILES)


@pytest.mark.parametrize("stem", sorted(FILES))
def test_codesign_config(stem):
    variant, name = FILES[stem]
    cfg = load(stem)
    args = model_args_for(cfg)
    assert cfg.model.name == variant and cfg.optimizer.name == name
    assert (args.dim, args.n_layers, args.n_heads, args.n_kv_heads, args.head_dim) == (768, 12, 6, 6, 128)
    assert 3 * args.hidden_dim == 2 * 4 * args.dim  # SwiGLU's three matrices hold the 4x MLP's two
    t = cfg.training
    assert (t.seq_len, t.global_batch_size, t.steps, t.max_norm) == (1024, 512, 3250, 1.0)
    s = cfg.lr_scheduler
    assert (s.warmup_steps, s.decay_ratio, s.decay_type, s.min_lr_factor) == (0, 0.7, "linear", 0.0)
    o = cfg.optimizer
    assert (o.lr, o.weight_decay, o.beta1, o.beta2, o.eps) == (5e-3, 0.1, 0.8, 0.95, 1e-7)
    assert o.multipliers() == {"embed": 0.3, "norm": 0.015} and o.muon_headwise == "FFF"
    with open(os.path.join(REPO, "configs", "codesign", f"{stem}.toml")) as f:
        header = f.read().split("\n[", 1)[0]
    assert "Seed 000" in header and "Not in the seed" in header and "Ours:" in header


def test_readme_lists_the_grid():
    with open(os.path.join(REPO, "configs", "README.md")) as f:
        text = f.read()
    assert all(f"`codesign/{stem}.toml`" in text for stem in FILES)
