"""Text generation throughput on one GPU: ours (KV cache, decode step as one CUDA graph) against
transformers' ``Qwen3ForCausalLM.generate`` (static and dynamic cache), the recompute-per-token path
lm-eval's adapter had before the cache, and the HBM bound.

    python -m scripts.bench.generate --out docs/bench/generate_h200

Random weights, 0.6B built on the GPU in bf16 (no download: transformers' Qwen3 is built from a
config and given our Transformer's weights). Greedy, no end token: every sequence gets exactly
``--new-tokens``. For each variant, batch and prompt length (all prompts of one length) it times one
``generate`` call after a warm-up call: tokens/s = batch x new tokens / wall time, prefill included
("per sequence" = new tokens / wall time). The decode step is that time less the prefill's (timed
alone), over new tokens - 1 steps. The HBM bound of a step: every weight once plus the K and V of the
mean context (prompt + new / 2), at the device's copy bandwidth (read + write). transformers runs
without torch.compile (``disable_compile``) unless ``--hf-compile``.
"""

from __future__ import annotations

import argparse
import dataclasses
import gc
import sys
import time

import torch

from eval.checkpoint import build_model
from parallax_titan.generation import Generator, SamplingParams, StopCriteria
from parallax_titan.hf_adapter import ParallaxStateDictAdapter
from parallax_titan.spec import BASE_FLAVORS, VARIANTS as MODEL_VARIANTS, variant_args
from scripts.bench.decode_timing import copy_bandwidth, log
from scripts.bench.results import command_line, describe, positive_int, table, write_results

VARIANTS = ("parallax", "transformer")
BATCHES = (1, 4, 32)
PROMPTS = (1024, 8192)
NEW_TOKENS = 128
RECOMPUTE_BATCH, RECOMPUTE_NEW = 4, 16  # the one recompute-path setting (at the shortest prompt)


def synchronized() -> float:
    """The time once the queued GPU work is done."""
    if torch.cuda.is_available():
        torch.cuda.synchronize()
    return time.perf_counter()


def build_ours(variant: str, flavor: str, positions: int) -> torch.nn.Module:
    """Our model of ``variant`` with random weights on the GPU in bf16 (RoPE table of ``positions``)."""
    args = dataclasses.replace(variant_args(variant, BASE_FLAVORS[flavor]), max_seq_len=positions)
    torch.manual_seed(0)
    model = build_model(args, torch.device("cuda"))
    rope_cache = model.rope_cache
    model.to(torch.bfloat16)
    model.rope_cache = rope_cache
    return model.eval()


def hf_qwen3(model: torch.nn.Module) -> torch.nn.Module:
    """transformers' Qwen3ForCausalLM built from a config (no download) holding the weights of
    ``model`` (a Transformer of ours), on its device in its dtype."""
    from transformers import Qwen3Config, Qwen3ForCausalLM

    args = model.model_args
    config = Qwen3Config(vocab_size=args.vocab_size, hidden_size=args.dim, intermediate_size=args.hidden_dim,
                         num_hidden_layers=args.n_layers, num_attention_heads=args.n_heads,
                         num_key_value_heads=args.n_kv_heads, head_dim=args.head_dim,
                         max_position_embeddings=args.max_seq_len, rope_theta=args.rope_theta,
                         rms_norm_eps=args.norm_eps, tie_word_embeddings=args.enable_weight_tying,
                         attn_implementation="sdpa")
    param = next(model.parameters())
    with torch.device(param.device):
        hf = Qwen3ForCausalLM(config).to(param.dtype)
    missing, unexpected = hf.load_state_dict(ParallaxStateDictAdapter(args).to_hf(model.state_dict()), strict=False)
    if unexpected or set(missing) - {"lm_head.weight"}:
        raise RuntimeError(f"transformers Qwen3 does not take our weights: missing {missing}, unexpected {unexpected}")
    return hf.eval()


def random_prompts(batch: int, length: int, vocab: int, seed: int) -> list[list[int]]:
    gen = torch.Generator().manual_seed(seed)
    return torch.randint(0, vocab, (batch, length), generator=gen).tolist()


def time_ours(model, batch: int, prompt: int, new: int, graph: bool = True) -> dict:
    """One timed ``Generator.generate`` (graph captured and kernels compiled by a warm-up call)."""
    generator = Generator(model, batch_size=batch, capacity=prompt + new, graph=graph)
    prompts = random_prompts(batch, prompt, model.model_args.vocab_size, seed=batch + prompt)
    stopping = StopCriteria(max_new_tokens=new)
    generator.generate(prompts, SamplingParams(), StopCriteria(max_new_tokens=4))
    start = synchronized()
    generator.session.prefill(prompts)
    prefill = synchronized() - start
    start = synchronized()
    out = generator.generate(prompts, SamplingParams(), stopping)
    total = synchronized() - start
    assert all(len(c.tokens) == new for c in out)
    return {"total_s": total, "prefill_s": prefill, "step_ms": 1e3 * (total - prefill) / (new - 1),
            "first_tokens": [c.tokens[0] for c in out]}


def time_hf(hf, batch: int, prompt: int, new: int, cache: str, compile_: bool) -> dict:
    """One timed transformers ``generate`` with ``cache`` ("static" or "dynamic") after a warm-up."""
    ids = torch.tensor(random_prompts(batch, prompt, hf.config.vocab_size, seed=batch + prompt), device=hf.device)
    kwargs = dict(attention_mask=torch.ones_like(ids), do_sample=False, pad_token_id=0, eos_token_id=None,
                  disable_compile=not compile_)
    if cache == "static":
        kwargs["cache_implementation"] = "static"
    with torch.no_grad():
        hf.generate(ids, max_new_tokens=4, **kwargs)
        start = synchronized()
        out = hf.generate(ids, max_new_tokens=new, **kwargs)
        total = synchronized() - start
    assert out.shape[1] == prompt + new
    return {"total_s": total, "first_tokens": out[:, prompt].tolist()}


@torch.no_grad()
def time_recompute(model, batch: int, prompt: int, new: int) -> dict:
    """The whole sequence through the model per new token (greedy), as lm-eval's adapter did."""
    device = next(model.parameters()).device
    tokens = torch.tensor(random_prompts(batch, prompt, model.model_args.vocab_size, seed=1), device=device)
    model(tokens[:, :8])
    start = synchronized()
    for _ in range(new):
        tokens = torch.cat([tokens, model(tokens)[:, -1].argmax(-1, keepdim=True)], dim=1)
    return {"total_s": synchronized() - start}


def step_bytes(model, batch: int, context: int) -> int:
    """Bytes one decode step reads: every weight once, K and V of ``context`` positions per row."""
    args = model.model_args
    weights = sum(p.numel() * p.element_size() for p in {id(p): p for p in model.parameters()}.values())
    return weights + 2 * args.n_layers * batch * context * args.n_kv_heads * args.head_dim * 2


def tokens_per_s(batch: int, new: int, seconds: float) -> float:
    return batch * new / seconds


def run(args) -> dict:
    copy_tbps = copy_bandwidth()
    rows, recompute = [], None
    positions = max(args.prompts) + args.new_tokens
    for variant in args.variants:
        model = build_ours(variant, args.flavor, positions)
        hf = hf_qwen3(model) if variant == "transformer" and not args.no_hf else None
        for batch in args.batches:
            for prompt in args.prompts:
                row = {"variant": variant, "batch": batch, "prompt": prompt, "new": args.new_tokens}
                row["ours"] = time_ours(model, batch, prompt, args.new_tokens)
                bound_bytes = step_bytes(model, batch, prompt + args.new_tokens // 2)
                row["bound_step_ms"] = bound_bytes / (copy_tbps * 1e12) * 1e3
                for cache in ("static", "dynamic") if hf is not None else ():
                    try:
                        row[f"hf_{cache}"] = time_hf(hf, batch, prompt, args.new_tokens, cache, args.hf_compile)
                    except torch.OutOfMemoryError as exc:
                        log(f"transformers {cache} out of memory at B={batch} P={prompt}: {str(exc)[:200]}")
                    gc.collect(), torch.cuda.empty_cache()
                log("row", row)
                rows.append(row)
                gc.collect(), torch.cuda.empty_cache()
        if variant == args.variants[0] and not args.no_recompute:
            setting = {"batch": RECOMPUTE_BATCH, "prompt": min(args.prompts), "new": RECOMPUTE_NEW}
            recompute = {"variant": variant, **setting, **time_recompute(model, *setting.values())}
            log("recompute", recompute)
        del model, hf
        gc.collect(), torch.cuda.empty_cache()
    return {"copy_tbps": copy_tbps, "rows": rows, "recompute": recompute}


def hf_best(rows: list[dict], batch: int, prompt: int) -> float | None:
    """transformers' best tokens/s (either cache) at one setting, from the transformer rows."""
    times = [row[k]["total_s"] for row in rows if (row["batch"], row["prompt"]) == (batch, prompt)
             for k in ("hf_static", "hf_dynamic") if k in row]
    new = rows[0]["new"]
    return tokens_per_s(batch, new, min(times)) if times else None


def markdown(result: dict) -> str:
    rows = result["rows"]
    fmt = lambda x: "-" if x is None else f"{x:,.0f}"

    def cells(row):
        b, p, n = row["batch"], row["prompt"], row["new"]
        ours = tokens_per_s(b, n, row["ours"]["total_s"])
        hf = {k: tokens_per_s(b, n, row[k]["total_s"]) if k in row else None for k in ("hf_static", "hf_dynamic")}
        best = hf_best(rows, b, p)
        bound = 1e3 / row["bound_step_ms"]
        same = "-"
        if "hf_dynamic" in row:  # same weights: greedy first tokens (bf16 near-ties may differ)
            pairs = zip(row["ours"]["first_tokens"], row["hf_dynamic"]["first_tokens"])
            same = f"{sum(a == h for a, h in pairs)}/{b}"
        return [row["variant"], b, p, fmt(ours), fmt(ours / b), f"{row['ours']['step_ms']:.2f}",
                f"{row['bound_step_ms']:.2f}", fmt(bound * b), fmt(hf["hf_static"]), fmt(hf["hf_dynamic"]),
                "-" if best is None else f"{ours / best:.1f}x", same]

    columns = ["model", "batch", "prompt", "ours tok/s", "ours tok/s/seq", "ours step ms", "HBM-bound step ms",
               "HBM-bound tok/s", "transformers static tok/s", "transformers dynamic tok/s", "ours / transformers",
               "first token = transformers'"]
    lines = [f"Copy bandwidth (the HBM ceiling used for the bound): {result['copy_tbps']:.2f} TB/s read + write.",
             "", *table(columns, map(cells, rows)), ""]
    rec = result.get("recompute")
    if rec:
        rate = tokens_per_s(rec["batch"], rec["new"], rec["total_s"])
        lines += [f"Recompute per token (lm-eval's adapter before the cache), {rec['variant']}, batch {rec['batch']}, "
                  f"prompt {rec['prompt']}, {rec['new']} new tokens: {rate:,.0f} tok/s ({rate / rec['batch']:,.0f} "
                  "per sequence); it slows as the sequence grows, so 128 tokens would be slower still.", ""]
    return "\n".join(lines)


MEASURED = ("greedy generation, bf16, random weights, equal-length prompts, no end token: tokens/s = batch x new "
            "tokens / wall time of one generate call (prefill included) after a warm-up call; ours = KV cache + "
            "decode step as one CUDA graph; transformers = Qwen3ForCausalLM.generate (sdpa) with our Transformer's "
            "weights; HBM bound = (weights + K/V of the mean context) / copy bandwidth per step")


def int_list(text: str) -> list[int]:
    """Comma-separated counts, each :func:`positive_int` (argparse type)."""
    return [positive_int(x) for x in text.split(",")]


def variant_list(text: str) -> list[str]:
    """Comma-separated model names of ``parallax_titan.spec.VARIANTS`` (argparse type): a misspelt one
    would fail only when its turn came, after the earlier variants' timings."""
    names = text.split(",")
    unknown = [name for name in names if name not in MODEL_VARIANTS]
    if unknown:
        raise argparse.ArgumentTypeError(f"{text!r}: unknown {unknown}; expected names from {list(MODEL_VARIANTS)}")
    return names


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    parser = argparse.ArgumentParser(prog="python -m scripts.bench.generate", description=__doc__.splitlines()[0])
    parser.add_argument("--variants", type=variant_list, default=list(VARIANTS))
    parser.add_argument("--batches", type=int_list, default=list(BATCHES))
    parser.add_argument("--prompts", type=int_list, default=list(PROMPTS), help="prompt lengths")
    parser.add_argument("--new-tokens", type=positive_int, default=NEW_TOKENS)
    parser.add_argument("--flavor", default="0.6B", choices=sorted(BASE_FLAVORS))
    parser.add_argument("--no-hf", action="store_true", help="skip transformers")
    parser.add_argument("--hf-compile", action="store_true", help="let transformers torch.compile the static cache")
    parser.add_argument("--no-recompute", action="store_true", help="skip the recompute-per-token setting")
    parser.add_argument("--out", default="docs/bench/generate_h200", help="output path without extension")
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        raise SystemExit("scripts.bench.generate needs a CUDA GPU")
    meta = describe("Text generation: KV cache and CUDA graph vs transformers", MEASURED,
                    command_line(__spec__.name, argv))
    t0 = time.time()
    result = run(args)
    log(write_results(args.out, meta, markdown(result), result))
    log(f"done {time.time() - t0:.0f}s")


if __name__ == "__main__":
    main()
