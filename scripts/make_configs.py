"""Write the training configs under configs/ (all but demo_cpu.toml and test_cpu_2rank.toml) and
configs/README.md, the table of what each config reproduces.

    python -m scripts.make_configs          # rewrite the files
    python -m scripts.make_configs --check  # exit 1 if a committed file differs (used by tests)

A config this script no longer generates is removed only when it starts with the script's first
line (GENERATED): a TOML of the user's under configs/ is never removed. Files are written whole.

Every recipe value below names its source: SPEC.md section 3, a passage of a seed paper (seed 000:
the codesign study; seed 001: the Parallax family paper; seed 003: the spectral-power weight-decay
paper), or the setting a seed names (seed 000: modded-NanoGPT). A value no source gives is marked
"ours" in the config header, with its reason.
"""

from __future__ import annotations

import argparse
import os
import sys
from dataclasses import dataclass

from parallax_titan.atomic import write_text

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RUN = "torchrun --nproc_per_node=8 train.py --job.config_file <this file>"

# --- Parallax paper (seed 001, Tables 2-3; SPEC.md sections 2-3) ----------------------------------
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


def paper_source(flavor: str, stem: str, recipe: str) -> tuple[str, str]:
    """(what the config reproduces, whether seed 001 reports the run) for a paper-grid config.

    Seed 001: Table 3 has Transformer and Parallax (Muon + WSD) at both sizes, the controls
    (dagger variants) and the fla baselines at 0.6B only, the rho-RoPE ablation "at both scales under
    Muon"; Figure 4(a) compares optimizers and schedules "all with RoPE applied" (size not stated).
    """
    if recipe == "muon_wsd":
        if stem in ("transformer", "parallax", "parallax_norope") or flavor == "0.6B":
            return "seed 001 Table 3", "yes"
        return "ours: completes the grid (seed 001 has the controls at 0.6B only)", "no"
    if stem in ("transformer", "parallax"):
        return "seed 001 Figure 4(a)", "yes (size not stated)"
    return "ours: completes the grid (seed 001 Figure 4(a) has Transformer and Parallax only)", "no"

# --- Seed 003 (spectral-power weight decay) --------------------------------------------------------
# Section 4 ("训练协议与系数扫描"): 12 layers, width 768, head dim 128, seq 4096, 524,288 tokens per
# step, seed 42, 16,204 steps, peak lr 0.005, 256 warmup steps, cosine to 0.1 x peak, ordinary WD 0.1,
# Muon scale 0.2 sqrt(max(d_in, d_out)) on the full projection; decay coefficients LR-coupled.
SEED003_MODEL = {"dim": 768, "n_layers": 12, "n_heads": 6, "n_kv_heads": 6, "head_dim": 128, "hidden_dim": 2304}
SEED003_BATCH = 524_288 // 4096  # 128 sequences
SEED003_SEED = 42
HEADWISE_STEPS = 16_204
HEADWISE_SCHEDULE = {"warmup_steps": 256, "decay_type": "cosine", "min_lr_factor": 0.1}
LAMBDA_V = 7e-5  # the selected HHF + S_2 run (final validation NLL 3.01324)
# The seed gives the sweeps' ranges only ("1e-5 to 5e-4, dense near 7e-5"; "0.005 and a fine sweep
# 0.004-0.010"); the points between are ours.
LAMBDA_V_SWEEP = (1e-5, 2e-5, 3e-5, 5e-5, 6e-5, 7e-5, 8e-5, 9e-5, 1e-4, 2e-4, 5e-4)
P0_V_SWEEP = (0.004, 0.005, 0.006, 0.007, 0.008, 0.009, 0.010)
# Section 5.1 ("按模块选择谱偏好"): 54 runs of 7,268 steps, independent coefficients (eta_t only, no
# ordinary WD), grid alpha x lambda_A x lambda_M for the families p_A = p_M = 1 and p_A = 0, p_M = 2.
ASYM_STEPS = 7_268
ASYM_LRS = (8e-4, 2.529822e-3, 8e-3)
ASYM_LAMBDAS = (8e-5, 2.529822e-4, 8e-4)
ASYM_FAMILIES = {"ordinary": (1, 1), "asymmetric": (0, 2)}  # name -> (p_A, p_M)
ASYM_PAIR = {  # the matched pair at alpha = 8e-4: (lambda_A, lambda_M, final validation loss)
    "ordinary": (2.52982213e-4, 8e-5, "3.000562422"),
    "asymmetric": (8e-5, 8e-5, "3.000577086"),
}
# Section 5 gives no schedule beyond a warmup and a final lr-decay stage (Figure 10: "预热后的训练",
# "最终学习率衰减阶段 ... 虚线标出该阶段的起点"); length and shape of both are ours.
ASYM_SCHEDULE = {"warmup_steps": 256, "decay_ratio": 0.2, "decay_type": "linear", "min_lr_factor": 0.0}

SEED003_MODEL_NOTE = (
    "Model: seed 003's softmax-attention Transformer (section 4: 12 layers, width 768, head dim 128;",
    "the full V matrix is 768 x 768 and CKA is averaged over six heads, so 6 query and 6 KV heads;",
    "nothing in the seed mentions a probe or Parallax). Built as our Qwen3 block (q/k RMSNorm, RoPE",
    "1e6, SwiGLU, tied embeddings, Qwen3 tokenizer). Ours, not in the seed: the FFN width 2304",
    "(Qwen3's 3x ratio), the block details, the Adam group of the non-matrix parameters (SPEC.md",
    "section 3's Muon recipe: beta (0.8, 0.95), eps 1e-7, lr x0.3 embeddings, x0.015 norms),",
    "grad clip 1.0, and the data (Ultra-FineWeb; the seed used its own ordered stream).",
    "Validation (seed: 10,485,760 tokens = 2,560 sequences, evaluated 164 times) needs a held-out set:",
    "  --validation.enable --validation.dataset local --validation.dataset_path <held-out files>",
    "  --validation.freq 100 --validation.seq_len 4096 (steps x local batch x ranks = 2,560 sequences).",
    "Compared runs must use the same number of GPUs (same data split) or training.data_order = global.",
)
ASYM_MODEL_NOTE = (
    "Model: section 5 names none; its MLP entropy eRank of 743 exceeds the 512 modes of the",
    "section 3.5 model, so this is the width-768 model of section 4 (12 layers assumed), with its",
    "batch (128 x 4096) and seed 42 (section 5 states neither). Schedule: warmup then a final decay",
    "stage (Figure 10); 256 warmup steps and a 20% linear decay to 0 are ours.",
)

# --- Seed 000's codesign study (section "Architecture-Optimizer Codesign") --------------------------
# The seed: "modded-NanoGPT experiments with four optimizers (Muon, Aurora, NorMuon, SOAP), each paired
# with Parallax (+Parallax, solid) and standard attention (dashed) ... Parallax reaches lower val loss at
# matched step count", and "Muon with warmup-stable-decay scheduling is likely suboptimal". It states no
# size, step count, batch or hyperparameter. Modded-NanoGPT's optimization track
# (records/track_3_optimization, where all four optimizers have results) fixes the model, data and batch:
# the GPT-2 124M shape (12 layers, width 768; heads of 128, so 6), causal attention over 1024-token
# sequences, 512 per step (524,288 tokens), validation on 20 x 524,288 tokens; its baseline
# (train_gpt_simple.py, tuned Muon) trains 3,250 steps, constant lr then linear to 0 over the last 70%.
CODESIGN_MODEL = {"dim": 768, "n_layers": 12, "n_heads": 6, "n_kv_heads": 6, "head_dim": 128, "hidden_dim": 2048}
CODESIGN_STEPS = 3_250
CODESIGN_BATCH = 512
CODESIGN_SEQ_LEN = 1024
CODESIGN_SCHEDULE = {"warmup_steps": 0, "decay_ratio": 0.7, "decay_type": "linear", "min_lr_factor": 0.0}
CODESIGN_OPTIMIZERS = {"muon": "Muon", "normuon": "NorMuon", "aurora": "Aurora", "soap": "SOAP"}
CODESIGN_NOTE = (
    "Not in the seed; from modded-NanoGPT's optimization track, the setting we read the seed's",
    "\"modded-NanoGPT experiments\" as (all four optimizers have results there): the GPT-2 124M shape",
    "(12 layers, width 768, 6 heads of 128, no GQA), 1024-token sequences, 512 per step, and its",
    "baseline's 3,250 steps with no warmup, constant lr, then linear to 0 over the last 70%.",
    "Ours: our Qwen3 block at that shape (q/k RMSNorm, RoPE 1e6, SwiGLU width 2048 = the 4x MLP's",
    "parameters in three matrices), the Qwen3 tokenizer with tied embeddings (151,936 x 768 = 117M",
    "embedding parameters; 85M in the blocks), Ultra-FineWeb (the track trains on FineWeb), and one",
    "recipe for all four optimizers so that only the optimizer changes: SPEC.md section 3's Muon recipe",
    "(lr 5e-3, weight decay 0.1, Adam group (0.8, 0.95), eps 1e-7, lr x0.3 embeddings, x0.015 norms,",
    "Muon scale 0.2 sqrt(max(m, n)); SOAP's Adam-normalised direction takes lr unscaled), each",
    "algorithm's own options at their defaults (docs/config.md), grad clip 1.0. None is tuned here.",
    "Validation loss (the seed's metric; the track's: 10,485,760 tokens every 125 steps) needs a",
    "held-out set:",
    "  --validation.enable --validation.dataset local --validation.dataset_path <held-out files>",
    "  --validation.freq 125 --validation.seq_len 1024",
    "Compared runs must use the same number of GPUs (same data split) or training.data_order = global.",
)

@dataclass(frozen=True)
class Entry:
    """One generated config: where it goes, what it holds, and what it reproduces."""

    path: str  # relative to the repository root
    config: dict
    header: tuple[str, ...]  # comment lines of the file (the description comes first)
    source: str  # README column "reproduces (seed, section)"
    ran: str  # README column "paper ran it"
    group: str = ""  # README: entries of one grid share a row


def job_config(stem: str, folder: str, model: dict, parallax: dict, optimizer: dict, scheduler: dict,
               description: str, batch: int, steps: int, ac_mode: str = "none", seed: int = 0,
               training: dict | None = None) -> dict:
    """One TorchTitan job as nested dicts (sections in TOML order)."""
    return {
        "job": {"dump_folder": f"./outputs/{folder}/{stem}", "description": description},
        "model": {**model, "hf_assets_path": "./assets/tokenizer/qwen3"},
        "parallax": {"attn_backend": "auto", **parallax},
        "optimizer": optimizer,
        "lr_scheduler": {k: v for k, v in scheduler.items() if v is not None},
        "training": {
            "dataset": "ultrafineweb", "seq_len": 4096, "local_batch_size": 4,
            "global_batch_size": batch, "steps": steps, "max_norm": 1.0,
            "mixed_precision_param": "bfloat16", "mixed_precision_reduce": "float32", **(training or {}),
        },
        # tokenise in one background process: in the training process it left the GPU idle
        # ~33 ms per 0.6B step (docs/bench/train_h200/README.md)
        "training.dataloader": {"num_workers": 1, "prefetch_factor": 2, "pin_memory": True},
        "parallelism": {"data_parallel_shard_degree": -1},
        "compile": {"enable": True, "components": ["model", "loss"]},
        "activation_checkpoint": {"mode": ac_mode},
        "metrics": {"log_freq": 10, "enable_tensorboard": True},
        "checkpoint": {"enable": True, "interval": 1000, "keep_latest_k": 3, "last_save_model_only": False},
        "debug": {"seed": seed},
    }


def paper_entries() -> list[Entry]:
    """The Parallax paper's runs: five variants x three recipes at 0.6B and 1.7B, plus the fla baselines."""
    out = []
    for flavor, (batch, ac_mode) in SIZES.items():
        for stem, (model, parallax) in VARIANTS.items():
            for recipe, (optimizer, scheduler) in RECIPES.items():
                name = f"{stem}_{recipe}"
                config = job_config(name, flavor, {"name": model, "flavor": flavor}, parallax, dict(optimizer),
                                    dict(scheduler), f"{stem} {flavor}, {recipe} (paper recipe)", batch, STEPS,
                                    ac_mode)
                source, ran = paper_source(flavor, stem, recipe)
                header = (f"Parallax paper recipe (SPEC.md section 3; seed 001 Table 2): {source}; paper ran it: {ran}.",)
                out.append(Entry(f"configs/paper/{flavor}/{name}.toml", config, header, source, ran))
    for stem in FLA_BASELINES:
        name = f"{stem}_muon_wsd"
        config = job_config(name, "0.6B", {"name": stem, "flavor": "0.6B"}, {}, {**MUON, "no_decay_categories": ["ssm"]},
                            dict(WSD), f"{stem} 0.6B, muon_wsd (paper recipe; needs flash-linear-attention)",
                            960, STEPS)
        header = ("Parallax paper recipe (SPEC.md section 3): seed 001 Table 3 (0.6B baseline); paper ran it: yes.",)
        out.append(Entry(f"configs/paper/0.6B/{name}.toml", config, header, "seed 001 Table 3", "yes"))
    return out


def parallax_ablation(stem: str, optimizer: dict, scheduler: dict, header: tuple[str, ...], source: str,
                      ran: str, group: str = "") -> Entry:
    """An optimizer ablation on the 0.6B Parallax model with the paper's batch, steps and seed."""
    config = job_config(stem, "0.6B", {"name": "parallax", "flavor": "0.6B"}, {}, {**MUON, **optimizer},
                        {**WSD, **scheduler}, f"{stem} (optimizer ablation)", 960, STEPS)
    return Entry(f"configs/ablations/0.6B/{stem}.toml", config, header, source, ran, group)


ATTN_AND_MLP = ["attn_q", "attn_k", "attn_v", "attn_o", "attn_r", "mlp"]


def ablation_entries() -> list[Entry]:
    """WDA (seed 000), our S_p power sweep, and the 0.6B port of seed 003's head-wise recipes."""
    out = [parallax_ablation(
        f"parallax_muon_wsd_wda{g}", {}, {"wd_anneal_gamma": g},
        (f"Weight-decay annealing lambda(t) = lambda (1 - t)^gamma over the WSD decay, gamma = {g}:",
         "seed 000 appendix G (gamma in {0.5, 1, 2} at 0.6B); the paper ran it."),
        "seed 000 appendix G", "yes", "wda") for g in (0.5, 1.0, 2.0)]
    for p in (0, 1, 2, 4):
        out.append(parallax_ablation(
            f"parallax_muon_wsd_sp{p}",
            {"no_decay_categories": ATTN_AND_MLP, "spectral_power_attn": p, "spectral_coeff_attn": 0.1,
             "spectral_power_mlp": p, "spectral_coeff_mlp": 0.1, "decay_coupling": "lr"}, {},
            (f"EXPLORATORY SWEEP OF OURS (no paper ran it): S_p decay with p = {p} replaces ordinary decay",
             "on the attention and MLP matrices of the 0.6B Parallax Muon + WSD recipe.",
             "Coefficient 0.1, LR-coupled: the recipe's own weight decay, so sp1 is the paper recipe",
             "exactly and the other powers change only the power at the same numeric coefficient.",
             "Seed 003 section 3.1 warns that equal coefficients are not equal strengths across powers; its",
             "own power sweep (section 3.5: 8 layers, width 512, lambda 0.01, then 0.003-0.03 per power)",
             "used another model and states no schedule, so its values are not transferable here."),
            "ours (exploratory; cf. seed 003 section 3.5)", "no", "sp"))
    port = ("PORT of seed 003 section 4 to the 0.6B Parallax model (the paper ran it on its own 12-layer",
            "softmax Transformer: configs/seed003/). Kept from the seed: lr 0.005, 256 warmup steps, cosine",
            "to 0.1 x peak, WD 0.1, Muon scale on the full projection; from the Parallax paper: model,",
            "batch 960 x 4096, 20,000 steps, seed 0. R's head-wise flag follows Q's.")
    for letters, extra in (("HHH", {}), ("HHF", {}), ("HHF_p2v", {"spectral_power_attn": 2,
                                                                  "spectral_coeff_attn": LAMBDA_V,
                                                                  "spectral_categories": ["attn_v"]})):
        out.append(parallax_ablation(
            f"parallax_muon_headwise_{letters}",
            {"muon_headwise": letters[:3], **extra, "decay_coupling": "lr"},
            {**HEADWISE_SCHEDULE, "decay_ratio": None}, port, "port of seed 003 section 4", "no (port)",
            "headwise_port"))
    return out


def seed003_job(stem: str, folder: str, optimizer: dict, scheduler: dict, steps: int, description: str) -> dict:
    """A job on seed 003's 12-layer width-768 softmax Transformer."""
    return job_config(stem, folder, {"name": "transformer", "flavor": "0.6B", **SEED003_MODEL}, {},
                      {**MUON, **optimizer}, scheduler, description, SEED003_BATCH, steps, seed=SEED003_SEED)


def headwise_entry(stem: str, letters: str, power: int, coeff: float, header: tuple[str, ...], folder: str,
                   ran: str, group: str = "") -> Entry:
    extra = ({"spectral_power_attn": power, "spectral_coeff_attn": coeff, "spectral_categories": ["attn_v"]}
             if coeff else {})
    config = seed003_job(stem, "seed003", {"muon_headwise": letters, **extra, "decay_coupling": "lr"},
                         dict(HEADWISE_SCHEDULE), HEADWISE_STEPS, f"{stem} (seed 003 section 4)")
    return Entry(f"configs/{folder}/{stem}.toml", config, header + SEED003_MODEL_NOTE, "seed 003 section 4",
                 ran, group)


def fmt(x: float) -> str:
    """Coefficient in a file name: 7e-05 -> 7e-05, 0.0025298 -> 2.53e-03."""
    return f"{x:.2e}".replace(".00e", "e")


def seed003_entries() -> list[Entry]:
    """Seed 003's head-wise recipes and sweeps (section 4) and asymmetric grid and pair (section 5)."""
    sec4 = "Seed 003 section 4 (head-wise Muon, V decay): "
    out = [
        headwise_entry("headwise_HHH", "HHH", 1, 0.0,
                       (sec4 + "HHH, ordinary WD 0.1 only; paper ran it (final val NLL 3.01968).",), "seed003",
                       "yes"),
        headwise_entry("headwise_HHF", "HHF", 1, 0.0,
                       (sec4 + "HHF, ordinary WD 0.1 only; paper ran it (final val NLL 3.01596).",), "seed003",
                       "yes"),
        headwise_entry("headwise_HHF_p2v", "HHF", 2, LAMBDA_V,
                       (sec4 + "HHF plus S_2 on the full V, lambda_V = 7e-5 LR-coupled, on top of WD 0.1;",
                        "paper ran it (final val NLL 3.01324)."), "seed003", "yes"),
    ]
    for lam in LAMBDA_V_SWEEP:
        out.append(headwise_entry(
            f"headwise_HHF_p2v_{fmt(lam)}", "HHF", 2, lam,
            (sec4 + f"lambda_V sweep of HHF + S_2 on V, lambda_V = {lam:g} (LR-coupled, plus WD 0.1).",
             "The paper swept 1e-5 to 5e-4, dense near 7e-5; which points it ran is not stated (ours)."),
            "seed003/headwise_sweeps", "range yes; points ours", "lambda_V"))
    for lam in P0_V_SWEEP:
        out.append(headwise_entry(
            f"headwise_HHF_p0v_{fmt(lam)}", "HHF", 0, lam,
            (sec4 + f"p = 0 control of HHF: S_0 (polar factor) on V, coefficient {lam:g} (LR-coupled, plus",
             "WD 0.1). The paper ran 0.005 and a fine sweep over 0.004-0.010; the points are ours."),
            "seed003/headwise_sweeps", "range yes; points ours", "p0_V"))
    for family, (p_a, p_m) in ASYM_FAMILIES.items():
        for lr in ASYM_LRS:
            for lam_a in ASYM_LAMBDAS:
                for lam_m in ASYM_LAMBDAS:
                    stem = f"{family}_lr{fmt(lr)}_A{fmt(lam_a)}_M{fmt(lam_m)}"
                    out.append(asym_entry(stem, "seed003/asymmetric_grid", p_a, p_m, lr, lam_a, lam_m,
                                          (f"Seed 003 section 5.1, {family} family (p_A = {p_a}, p_M = {p_m}) of the"
                                           " 54-run grid; the paper ran it.",), "yes", f"asym_{family}"))
    for family, (p_a, p_m) in ASYM_FAMILIES.items():
        lam_a, lam_m, loss = ASYM_PAIR[family]
        out.append(asym_entry(f"asymmetric_pair_{family}", "seed003", p_a, p_m, 8e-4, lam_a, lam_m,
                              (f"Seed 003 section 5.1, matched pair, {family}: alpha 8e-4, p_A = {p_a},"
                               f" lambda_A = {lam_a:g}, p_M = {p_m}, lambda_M = {lam_m:g};",
                               f"the paper ran it (final validation loss {loss}).",), "yes"))
    return out


def asym_entry(stem: str, folder: str, p_a: int, p_m: int, lr: float, lam_a: float, lam_m: float,
               header: tuple[str, ...], ran: str, group: str = "") -> Entry:
    optimizer = {"lr": lr, "weight_decay": 0.0, "decay_coupling": "independent",
                 "spectral_power_attn": p_a, "spectral_coeff_attn": lam_a,
                 "spectral_power_mlp": p_m, "spectral_coeff_mlp": lam_m}
    config = seed003_job(stem, "seed003", optimizer, dict(ASYM_SCHEDULE), ASYM_STEPS,
                         f"{stem} (seed 003 section 5.1)")
    header = header + ("Coefficients independent of the lr (eta_t only), no ordinary WD, as section 5.1 says.",)
    return Entry(f"configs/{folder}/{stem}.toml", config, header + ASYM_MODEL_NOTE, "seed 003 section 5.1", ran,
                 group)


def codesign_entries() -> list[Entry]:
    """Seed 000's codesign grid: four optimizers x {softmax attention, Parallax} at the GPT-2 124M shape."""
    out = []
    for variant in ("transformer", "parallax"):
        for stem, name in CODESIGN_OPTIMIZERS.items():
            file = f"{variant}_{stem}"
            config = job_config(file, "codesign", {"name": variant, "flavor": "0.6B", **CODESIGN_MODEL}, {},
                                {**MUON, "name": name}, dict(CODESIGN_SCHEDULE),
                                f"{file} (seed 000 codesign: {name}, {variant})", CODESIGN_BATCH, CODESIGN_STEPS,
                                training={"seq_len": CODESIGN_SEQ_LEN, "local_batch_size": 16})
            header = (f"Seed 000, \"Architecture-Optimizer Codesign\": {name} with "
                      f"{'Parallax' if variant == 'parallax' else 'softmax attention'}, one of 4 optimizers x "
                      "{softmax, Parallax};",
                      "from the seed: the four optimizers, each with and without Parallax, compared at matched steps.")
            out.append(Entry(f"configs/codesign/{file}.toml", config, header + CODESIGN_NOTE,
                             "seed 000 codesign (setting: modded-NanoGPT's optimization track)",
                             "port (seed: modded-NanoGPT's GPT)"))
    return out


def all_entries() -> list[Entry]:
    """Every generated config."""
    return paper_entries() + ablation_entries() + seed003_entries() + codesign_entries()


def all_configs() -> dict[str, dict]:
    """Relative path -> config dict for every generated file."""
    return {e.path: e.config for e in all_entries()}


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


GENERATED = "# Generated by scripts/make_configs.py; edit the script, not this file."


def to_toml(entry: Entry) -> str:
    lines = [GENERATED,
             *(f"# {line}" for line in entry.header), f"#   {RUN}"]
    for section, values in entry.config.items():
        lines += ["", f"[{section}]"] + [f"{k} = {toml_value(v)}" for k, v in values.items()]
    return "\n".join(lines) + "\n"


README_HEAD = """# Training configs

Generated by `python -m scripts.make_configs` (recipe tables with their sources in the script;
`--check` fails when a file is stale). Every file's header says what it reproduces and which of
its values no source gives. `demo_cpu.toml` and `test_cpu_2rank.toml` are hand-written CPU configs,
`mad/` holds the MAD grids (docs/mad.md).

Seeds: 000 = the Parallax codesign study, 001 = the Parallax family paper, 003 = the
spectral-power weight-decay (S_p) paper (SPEC.md section 3, "Seed 003's experiments").
"Paper ran it": yes = the paper reports this run; port = the paper's recipe moved to another
model; no = ours.

| config | reproduces (seed, section) | paper ran it |
|---|---|---|
"""


GRIDS = {  # README: the entries of these groups share one row (their folder and count)
    "lambda_V": "HHF + S_2 on V, lambda_V sweep", "p0_V": "HHF + S_0 on V, p = 0 control",
    "asym_ordinary": "ordinary family p_A = p_M = 1", "asym_asymmetric": "asymmetric family p_A = 0, p_M = 2",
}


def readme(entries: list[Entry]) -> str:
    """configs/README.md: one row per config, one per grid (its folder and size)."""
    rows: dict[str, list] = {}
    for e in entries:
        key = e.group if e.group in GRIDS else e.path
        rows.setdefault(key, [e, 0])[1] += 1
    lines = []
    for key, (e, count) in rows.items():
        name = f"`{e.path.removeprefix('configs/')}`"
        if key in GRIDS:
            name = f"`{os.path.dirname(e.path).removeprefix('configs/')}/` ({count} files: {GRIDS[key]})"
        lines.append(f"| {name} | {e.source} | {e.ran} |")
    return README_HEAD + "\n".join(lines) + "\n"


HAND_WRITTEN = ("configs/demo_cpu.toml", "configs/test_cpu_2rank.toml")


def generated(path: str) -> bool:
    """Whether the file ``path`` starts with this script's first line (a user's own config does not)."""
    with open(path, encoding="utf-8", errors="replace") as f:
        return f.readline().rstrip("\n") == GENERATED


def owned_on_disk() -> set[str]:
    """Relative paths of the TOMLs on disk that this script wrote (all but the hand-written ones, mad/
    and any other config without its first line: those are the user's)."""
    out = set()
    for folder, _, names in os.walk(os.path.join(ROOT, "configs")):
        for name in names:
            rel = os.path.relpath(os.path.join(folder, name), ROOT)
            if (name.endswith(".toml") and rel not in HAND_WRITTEN and not rel.startswith("configs/mad/")
                    and generated(os.path.join(ROOT, rel))):
                out.add(rel)
    return out


def written_files() -> dict[str, str]:
    """Relative path -> text of every file this script owns."""
    entries = all_entries()
    files = {e.path: to_toml(e) for e in entries}
    files["configs/README.md"] = readme(entries)
    return files


def main(argv: list[str] | None = None) -> int:
    """Write (or with ``--check`` compare) every generated file; returns the exit code."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="only compare with the files on disk")
    args = parser.parse_args(argv)
    stale = []
    files = written_files()
    for rel, text in files.items():
        path = os.path.join(ROOT, rel)
        current = open(path).read() if os.path.exists(path) else None
        if current != text:
            stale.append(rel)
            if not args.check:
                os.makedirs(os.path.dirname(path), exist_ok=True)
                write_text(path, text)
    extra = sorted(owned_on_disk() - set(files))
    if not args.check:
        for rel in extra:  # a config this script no longer generates
            os.remove(os.path.join(ROOT, rel))
    if args.check and (stale or extra):
        print("out of date (run python -m scripts.make_configs):\n  " + "\n  ".join(stale + extra))
        return 1
    print(f"{len(files)} files, {len(stale)} {'stale' if args.check else 'written'}, {len(extra)} "
          f"{'not generated' if args.check else 'removed'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
