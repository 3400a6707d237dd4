"""Write the paper's configs (configs/paper/) and the optimizer ablations (configs/ablations/).

    python -m scripts.make_configs          # rewrite the files
    python -m scripts.make_configs --check  # exit 1 if a committed file differs (used by tests)

One recipe table (SPEC.md section 3) generates every file, so the configs cannot drift apart.
"""

from __future__ import annotations

import argparse
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

VARIANTS = {  # file stem -> (model.name, [parallax] overrides)
    "transformer": ("transformer", {}),
    "transformer_dagger": ("transformer_dagger", {}),
    "parallax": ("parallax", {}),
    "parallax_norope": ("parallax", {"rho_rope": False}),
    "parallax_dagger": ("parallax_dagger", {}),
}
# flash-linear-attention baselines (optional install, docs/mixers.md): 0.6B, Muon + WSD only, with
# their decay parameters (A_log, dt_bias: routing category "ssm") kept out of weight decay as in fla.
FLA_BASELINES = ("gated_deltanet", "kda")
SIZES = {  # flavor -> global batch (sequences of 4096 tokens), activation checkpointing
    "0.6B": (960, "none"),
    "1.7B": (1920, "selective"),
}
STEPS = 20_000

MUON = {
    "name": "Muon", "lr": 5e-3, "weight_decay": 0.1, "muon_momentum": 0.95,
    "beta1": 0.8, "beta2": 0.95, "eps": 1e-7, "lr_multipliers": ["embed=0.3", "norm=0.015"],
    "orthogonalizer": "polar_express", "muon_update_scale": "match_rms_adamw",
}
ADAMW = {"name": "AdamW", "lr": 3e-4, "weight_decay": 0.1, "beta1": 0.9, "beta2": 0.95, "eps": 1e-8}
WSD = {"warmup_steps": 0, "decay_ratio": 0.2, "decay_type": "linear", "min_lr_factor": 0.0}
COSINE = {"warmup_steps": STEPS // 100, "decay_type": "cosine", "min_lr_factor": 0.0}
RECIPES = {
    "muon_wsd": (MUON, WSD),
    "adamw_wsd": (ADAMW, WSD),
    "adamw_cosine": (ADAMW, COSINE),
}

ABLATIONS = {  # file stem -> (optimizer overrides, lr_scheduler overrides), on Parallax 0.6B Muon+WSD
    **{f"parallax_muon_wsd_wda{g}": ({}, {"wd_anneal_gamma": g}) for g in (0.5, 1.0, 2.0)},
    **{
        f"parallax_muon_wsd_sp{p}": (
            {"spectral_power_attn": p, "spectral_coeff_attn": 1e-4,
             "spectral_power_mlp": p, "spectral_coeff_mlp": 1e-4, "decay_coupling": "lr"}, {})
        for p in (0, 1, 2, 4)
    },
    "parallax_muon_wsd_asymmetric": (
        {"lr": 8e-4, "weight_decay": 0.0, "decay_coupling": "independent",
         "spectral_power_attn": 0, "spectral_coeff_attn": 8e-5,
         "spectral_power_mlp": 2, "spectral_coeff_mlp": 8e-5}, {}),
    **{
        f"parallax_muon_headwise_{letters}": (
            {"muon_headwise": letters, "spectral_power_attn": 2, "spectral_coeff_attn": 7e-5,
             "spectral_categories": ["attn_v"], "decay_coupling": "lr"},
            {"warmup_steps": 256, "decay_type": "cosine", "min_lr_factor": 0.1, "decay_ratio": None})
        for letters in ("HHH", "HHF")
    },
}


def job_config(stem: str, model: str, flavor: str, parallax: dict, optimizer: dict, scheduler: dict,
               description: str) -> dict:
    batch, ac_mode = SIZES[flavor]
    return {
        "job": {"dump_folder": f"./outputs/{flavor}/{stem}", "description": description},
        "model": {"name": model, "flavor": flavor, "hf_assets_path": "./assets/tokenizer/qwen3"},
        "parallax": {"attn_backend": "auto", **parallax},
        "optimizer": optimizer,
        "lr_scheduler": {k: v for k, v in scheduler.items() if v is not None},
        "training": {
            "dataset": "ultrafineweb", "seq_len": 4096, "local_batch_size": 4,
            "global_batch_size": batch, "steps": STEPS, "max_norm": 1.0,
            "mixed_precision_param": "bfloat16", "mixed_precision_reduce": "float32",
        },
        # tokenise in one background process: in the training process it left the GPU idle
        # ~33 ms per 0.6B step (docs/bench/train_h200/README.md)
        "training.dataloader": {"num_workers": 1, "prefetch_factor": 2, "pin_memory": True},
        "parallelism": {"data_parallel_shard_degree": -1},
        "compile": {"enable": True, "components": ["model", "loss"]},
        "activation_checkpoint": {"mode": ac_mode},
        "metrics": {"log_freq": 10, "enable_tensorboard": True},
        "checkpoint": {"enable": True, "interval": 1000, "keep_latest_k": 3, "last_save_model_only": False},
        "debug": {"seed": 0},
    }


def all_configs() -> dict[str, dict]:
    """Relative path -> config dict for every generated file."""
    out = {}
    for flavor in SIZES:
        for stem, (model, parallax) in VARIANTS.items():
            for recipe, (optimizer, scheduler) in RECIPES.items():
                name = f"{stem}_{recipe}"
                out[f"configs/paper/{flavor}/{name}.toml"] = job_config(
                    name, model, flavor, parallax, dict(optimizer), dict(scheduler),
                    f"{stem} {flavor}, {recipe} (paper recipe)")
    for stem in FLA_BASELINES:
        name = f"{stem}_muon_wsd"
        out[f"configs/paper/0.6B/{name}.toml"] = job_config(
            name, stem, "0.6B", {}, {**MUON, "no_decay_categories": ["ssm"]}, dict(WSD),
            f"{stem} 0.6B, muon_wsd (paper recipe; needs flash-linear-attention)")
    for stem, (opt, sched) in ABLATIONS.items():
        out[f"configs/ablations/0.6B/{stem}.toml"] = job_config(
            stem, "parallax", "0.6B", {}, {**MUON, **opt}, {**WSD, **sched}, f"{stem} (optimizer ablation)")
    return out


def toml_value(value) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return repr(value)
    if isinstance(value, str):
        return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'
    if isinstance(value, list):
        return "[" + ", ".join(toml_value(v) for v in value) + "]"
    raise TypeError(f"cannot write {value!r} as TOML")


def to_toml(config: dict, source: str) -> str:
    lines = [f"# Generated by scripts/make_configs.py ({source}); edit the script, not this file.",
             "#   torchrun --nproc_per_node=8 train.py --job.config_file <this file>"]
    for section, values in config.items():
        lines += ["", f"[{section}]"] + [f"{k} = {toml_value(v)}" for k, v in values.items()]
    return "\n".join(lines) + "\n"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="only compare with the files on disk")
    args = parser.parse_args()
    stale = []
    for rel, config in all_configs().items():
        text = to_toml(config, "paper recipes, SPEC.md section 3")
        path = os.path.join(ROOT, rel)
        current = open(path).read() if os.path.exists(path) else None
        if current != text:
            stale.append(rel)
            if not args.check:
                os.makedirs(os.path.dirname(path), exist_ok=True)
                with open(path, "w") as f:
                    f.write(text)
    if args.check and stale:
        print("out of date (run python -m scripts.make_configs):\n  " + "\n  ".join(stale))
        return 1
    print(f"{len(all_configs())} configs, {len(stale)} {'stale' if args.check else 'written'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
