"""Data pipeline throughput on the CPU: pre-tokenization per core and the pre-tokenized loader per rank.

Reproduce (writes docs/bench/data.md and .json):
    python -m scripts.bench.data --out docs/bench/data

Measured on the embedded corpus, with the Qwen3 tokenizer when ``assets/tokenizer/qwen3`` exists
(``python -m scripts.get_tokenizer``) and the tiny test tokenizer:

* the tokenizer's own batch speed (``tokenizers`` ``encode_batch_fast``, one thread): the reference;
* ``scripts.pretokenize`` end to end (read, hash, encode, write shards) of ``--copies`` copies of
  the corpus with 1 process, and with ``--num-proc`` processes, in tokens/s and per process;
* TorchTitan-style tokenization while training (``training.dataset = "default_corpus"``), one rank;
* the ``pretokenized`` loader of one rank of 8 at the 0.6B recipe's shapes (local batch 4 x 4096,
  permuted, block-causal document starts on and off): tokens/s, CPU seconds per wall second while
  it runs, and the share of one core it needs to feed one H200 at ``--consume`` tokens/s.
"""

from __future__ import annotations

import argparse
import os
import resource
import shutil
import sys
import tempfile
import time

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")  # one thread: figures per core

from scripts.bench.results import command_line, describe, positive_int, table, write_results  # noqa: E402

QWEN3 = os.path.join("assets", "tokenizer", "qwen3")
H200_TOKENS_PER_S = 60_000  # what one H200 consumes at 0.6B (docs/bench/train_h200)


def cpu_seconds() -> float:
    """User + system CPU time of this process and its finished children."""
    own, children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


def timed(fn):
    """(result, wall seconds, CPU seconds) of ``fn()``."""
    wall, cpu = time.perf_counter(), cpu_seconds()
    result = fn()
    return result, time.perf_counter() - wall, cpu_seconds() - cpu


def corpus_texts() -> list[str]:
    from parallax_titan.data.pretokenize import EMBEDDED_FILES
    from parallax_titan.data.records import jsonl_texts

    return [text for path in EMBEDDED_FILES for _, text in jsonl_texts(path)]


def tokenizer_reference(tokenizer_path: str, texts: list[str], repeats: int) -> dict:
    """The tokenizer's own batch encoding of the corpus, one thread (best of ``repeats``)."""
    from parallax_titan.tokenizer import load_tokenizer_json

    tokenizer = load_tokenizer_json(tokenizer_path)
    tokenizer.encode_special_tokens = True
    best, tokens = float("inf"), 0
    for _ in range(repeats):
        encodings, wall, _ = timed(lambda: tokenizer.encode_batch_fast(texts, add_special_tokens=False))
        tokens = sum(len(e.ids) for e in encodings) + len(texts)
        best = min(best, wall)
    return {"tokens": tokens, "seconds": best, "tokens_per_s": tokens / best}


def write_copies(texts: list[str], path: str, copies: int) -> str:
    """``copies`` copies of the corpus as one JSONL file (long enough that start-up costs do not dominate)."""
    import json

    with open(path, "w", encoding="utf-8") as f:
        for _ in range(copies):
            f.writelines(json.dumps({"content": t}) + "\n" for t in texts)
    return path


def pretokenize_run(tokenizer_path: str, source: str, out: str, num_proc: int) -> dict:
    """``scripts.pretokenize`` of the JSONL file ``source``, from nothing, with ``num_proc`` processes
    (start-up included: planning, hashing the tokenizer, loading it in each process)."""
    from parallax_titan.data.pretokenize import Options, SourceSpec, pretokenize

    shutil.rmtree(out, ignore_errors=True)
    options = Options(validation_fraction=0.01, docs_per_shard=500)
    manifest, wall, cpu = timed(lambda: pretokenize(SourceSpec("local", source), out, tokenizer_path, options,
                                                    num_proc, progress=False))
    tokens = sum(manifest["splits"][s]["tokens"] for s in manifest["splits"])
    return {"processes": num_proc, "tokens": tokens, "seconds": wall, "cpu_seconds": cpu,
            "tokens_per_s": tokens / wall, "tokens_per_cpu_s": tokens / cpu}


def job(tokenizer_path: str, dataset: str, path: str | None, mask: str = "causal"):
    from parallax_titan.config import JobConfig

    j = JobConfig()
    j.model.hf_assets_path = tokenizer_path
    j.training.dataset, j.training.dataset_path = dataset, path
    j.training.seq_len, j.training.local_batch_size, j.training.global_batch_size = 4096, 4, 960
    j.training.data_order = "sharded"
    j.parallax.attn_mask_type = mask
    return j


def loader_run(loader, batches: int) -> dict:
    """Tokens/s of ``batches`` batches of ``loader`` (after one warm-up batch) and CPU use."""
    it = iter(loader)
    next(it)

    def consume():
        return sum(next(it)[1].numel() for _ in range(batches))

    tokens, wall, cpu = timed(consume)
    return {"batches": batches, "tokens": tokens, "seconds": wall, "tokens_per_s": tokens / wall,
            "cpu_per_wall": cpu / wall, "core_share_at_h200_rate": H200_TOKENS_PER_S / (tokens / wall) * cpu / wall}


def text_loader(tokenizer_path: str, batches: int) -> dict:
    """Tokenizing while training: the embedded corpus through the text loader, one rank."""
    from parallax_titan.data import build_dataloader
    from parallax_titan.tokenizer import PretrainTokenizer

    tokenizer = PretrainTokenizer(tokenizer_path)
    return loader_run(build_dataloader(1, 0, tokenizer, job(tokenizer_path, "default_corpus", None)), batches)


def pretokenized_loader(tokenizer_path: str, root: str, batches: int, mask: str) -> dict:
    """Rank 0 of 8 of the ``pretokenized`` loader over the shards at ``root``."""
    from parallax_titan.data import build_dataloader

    return loader_run(build_dataloader(8, 0, None, job(tokenizer_path, "pretokenized", root, mask)), batches)


def tokenizers_available() -> dict[str, str]:
    from parallax_titan.tokenizer import TINY_TOKENIZER_PATH

    found = {"qwen3": QWEN3} if os.path.isfile(os.path.join(QWEN3, "tokenizer.json")) else {}
    return {**found, "tiny": TINY_TOKENIZER_PATH}


def measure(args) -> dict:
    texts = corpus_texts()
    results = {"cpu_cores": os.cpu_count(), "h200_tokens_per_s": H200_TOKENS_PER_S, "tokenizers": {}}
    work = tempfile.mkdtemp(prefix="bench_data_")
    results["corpus_copies"] = args.copies
    try:
        source = write_copies(texts, os.path.join(work, "corpus.jsonl"), args.copies)
        for name, path in tokenizers_available().items():
            root = os.path.join(work, name)
            entry = {"reference": tokenizer_reference(path, texts, args.repeats),
                     "pretokenize": [pretokenize_run(path, source, root, n) for n in sorted({1, args.num_proc})],
                     "text_loader": text_loader(path, args.text_batches),
                     "pretokenized_loader": {mask: pretokenized_loader(path, root, args.batches, mask)
                                             for mask in ("causal", "block_causal")}}
            results["tokenizers"][name] = entry
            print(name, entry, file=sys.stderr)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return results


def kilo(x: float) -> str:
    return f"{x / 1e3:,.0f}k"


def render(results: dict) -> str:
    rows_pt, rows_loader = [], []
    for name, entry in results["tokenizers"].items():
        ref = entry["reference"]["tokens_per_s"]
        rows_pt.append([name, "tokenizers `encode_batch_fast`, 1 thread (reference)", kilo(ref), "", "1.00"])
        for run in entry["pretokenize"]:
            per_process = run["tokens_per_s"] / run["processes"]
            rows_pt.append([name, f"`scripts.pretokenize`, {run['processes']} process(es)", kilo(run["tokens_per_s"]),
                            kilo(per_process), f"{per_process / ref:.2f}"])
        text = entry["text_loader"]
        rows_loader.append([name, "text, tokenized while training (`default_corpus`)", kilo(text["tokens_per_s"]),
                            f"{text['cpu_per_wall']:.2f}", f"{text['core_share_at_h200_rate']:.2g}",
                            f"{text['tokens_per_s'] / results['h200_tokens_per_s']:.1f}x"])
        for mask, run in entry["pretokenized_loader"].items():
            rows_loader.append([name, f"`pretokenized`, rank 0 of 8, {mask}", kilo(run["tokens_per_s"]),
                                f"{run['cpu_per_wall']:.2f}", f"{run['core_share_at_h200_rate']:.2g}",
                                f"{run['tokens_per_s'] / results['h200_tokens_per_s']:.1f}x"])
    lines = [
        f"This machine has {results['cpu_cores']} CPU cores, shared with other jobs while it ran: the figures are "
        "lower bounds of what an idle core gives; the ratios are the robust part.", "",
        "## Pre-tokenization of the embedded corpus", "",
        f"Input: the embedded corpus ({results['corpus_copies']} copies in one JSONL file, 500 documents per shard); "
        "the reference encodes one copy. Pre-tokenization times include start-up: planning the shards, hashing "
        "and loading the tokenizer in every process.", "",
        *table(["tokenizer", "what", "tokens/s", "tokens/s per process", "per process / reference"], rows_pt), "",
        "## Loader throughput, one rank", "",
        f"Local batch 4 x 4096 (the 0.6B recipe); goal: at least 20x what one H200 consumes at 0.6B "
        f"({results['h200_tokens_per_s']:,} tokens/s), using under one core.", "",
        *table(["tokenizer", "loader", "tokens/s", "CPU s per wall s", "core share at the H200's rate",
                "x the H200's rate"], rows_loader), "",
        "The pretokenized loader reads memory-mapped shards in the page cache (a second pass over the same shards); "
        "from disk each batch is b random reads of 16 KiB.", ""]
    return "\n".join(lines)


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m scripts.bench.data", description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", default="outputs/bench/data", help="results prefix (writes PREFIX.md and .json)")
    parser.add_argument("--num-proc", type=positive_int, default=os.cpu_count() or 1,
                        help="processes of the parallel run")
    parser.add_argument("--copies", type=positive_int, default=4, help="copies of the corpus pre-tokenized")
    parser.add_argument("--repeats", type=positive_int, default=3, help="reference runs (best kept)")
    parser.add_argument("--batches", type=positive_int, default=400, help="pretokenized loader batches timed")
    parser.add_argument("--text-batches", type=positive_int, default=20, help="text loader batches timed")
    args = parser.parse_args(argv)
    results = measure(args)
    meta = describe("Data pipeline throughput (CPU)", "pre-tokenization per core against the tokenizer's own batch "
                    "speed; loader tokens/s per rank and CPU use", command_line("scripts.bench.data", argv))
    print(write_results(args.out, meta, render(results), results))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
