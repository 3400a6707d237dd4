"""Pre-tokenize a text source into shards for ``[training] dataset = "pretokenized"``.

    python -m scripts.pretokenize --source embedded --tokenizer parallax_titan/assets/tokenizer/tiny \\
        --out data/embedded_tiny --docs-per-shard 500
    python -m scripts.pretokenize --source hub --path openbmb/Ultra-FineWeb --name default --split en \\
        --tokenizer assets/tokenizer/qwen3 --out /data/ufw_qwen3 --num-proc 32
    python -m scripts.pretokenize --source local --path '/data/corpus/*.parquet' --tokenizer ... --out ...

A killed run continues where it stopped when rerun with the same arguments; finished shards are
kept. The output format and the validation split are described in docs/data.md.
"""

from __future__ import annotations

import argparse
import os
import sys

from parallax_titan.checkpoint_files import check_output_folder
from parallax_titan.data.pretokenize import SOURCE_KINDS, Options, SourceSpec, check_options, check_source, pretokenize
from parallax_titan.data.records import DEFAULT_MAX_RECORD_BYTES
from parallax_titan.data.shards import MANIFEST, PLAN, SPLITS, UNITS_DIR
from parallax_titan.tokenizer import check_tokenizer_path
from scripts.bench.results import positive_int

OUTPUT_ENTRIES = (MANIFEST, PLAN, UNITS_DIR, *SPLITS)
"""What a pre-tokenization folder holds; an ``--out`` holding anything else is refused."""


def check_out(out: str) -> None:
    """ValueError naming ``--out`` unless it is new (and can be created), empty, or an earlier
    pre-tokenization (which the run resumes, or refuses when asked for other settings)."""
    check_output_folder(out, "--out", OUTPUT_ENTRIES.__contains__, "a pre-tokenization of scripts.pretokenize",
                        "which a rerun with the same arguments resumes")


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m scripts.pretokenize", description=__doc__.split("\n\n")[0])
    parser.add_argument("--source", choices=SOURCE_KINDS, required=True,
                        help="embedded: the corpus in parallax_titan/assets; local: JSONL/parquet files; hub: a "
                             "Hugging Face dataset (id or local clone) read with `datasets`")
    parser.add_argument("--path", default="", help="local: a file, directory or glob; hub: the dataset id or clone")
    parser.add_argument("--name", default=None, help="hub: the dataset config (Ultra-FineWeb: default)")
    parser.add_argument("--split", default="train", help="hub: the split to read (Ultra-FineWeb: en)")
    parser.add_argument("--revision", default=None, help="hub: branch, tag or commit (recorded in the manifest)")
    parser.add_argument("--tokenizer", required=True, help="folder with tokenizer.json (model.hf_assets_path)")
    parser.add_argument("--out", required=True, help="output folder (created; a rerun resumes it)")
    parser.add_argument("--validation-fraction", type=float, default=0.01,
                        help="share of documents, chosen by a hash of their text, in the validation split")
    parser.add_argument("--docs-per-shard", type=int, default=0,
                        help="records per shard for local files (0: one shard per file)")
    parser.add_argument("--num-proc", type=positive_int, default=max(1, (os.cpu_count() or 1)),
                        help="processes, each tokenizing one shard at a time on one core")
    parser.add_argument("--batch-size", type=int, default=1024, help="documents per tokenizer batch")
    parser.add_argument("--bad-data", choices=("error", "skip"), default="error",
                        help="a malformed record: stop naming file and line, or skip it and count it by reason "
                             "(reliability.bad_data)")
    parser.add_argument("--max-record-bytes", type=positive_int, default=DEFAULT_MAX_RECORD_BYTES,
                        help="longest JSONL line read; a longer one is a bad record")
    parser.add_argument("--no-progress", action="store_true", help="no progress bar")
    return parser.parse_args(argv)


def main(argv: list[str]) -> int:
    args = parse_args(argv)
    if args.source != "embedded" and not args.path:
        print(f"error: --path is required with --source {args.source}", file=sys.stderr)
        return 2
    options = Options(args.validation_fraction, args.docs_per_shard, args.batch_size, args.bad_data,
                      args.max_record_bytes)
    spec = SourceSpec(args.source, args.path, args.name, args.split, args.revision)
    try:  # before the source is listed and counted
        check_source(spec, options)
        check_options(options)
        check_tokenizer_path(args.tokenizer, "--tokenizer")
        check_out(args.out)
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    try:
        manifest = pretokenize(spec, args.out, args.tokenizer, options, args.num_proc, not args.no_progress)
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    for split, info in manifest["splits"].items():
        print(f"{split}: {info['tokens']:,} tokens, {info['documents']:,} documents, {len(info['shards'])} shards")
    bad = sum(n for counts in manifest["bad_records"].values() for n in counts.values())
    if bad:
        print(f"skipped {bad} bad records: {manifest['bad_records']}")
    print(f"wrote {os.path.join(args.out, 'manifest.json')}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
