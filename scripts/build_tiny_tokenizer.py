"""Train the tiny byte-level BPE tokenizer (vocab 4096) on the embedded corpus.

It exists for fast CPU runs and tests; real training uses the Qwen3 tokenizer
(``python -m scripts.get_tokenizer``). Same conventions as Qwen3 for pretraining: the only
special token is ``<|endoftext|>`` (end of document), there is no BOS token and
the tokenizer itself adds nothing (``encode("")`` is empty).

Usage:
    python -m scripts.build_tiny_tokenizer [--corpus FILE] [--out-dir DIR] [--vocab-size N]
"""

import argparse
import gzip
import json
import os

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

from parallax_titan.tokenizer import EOS_TOKEN, write_tokenizer_config

ASSETS = os.path.join(os.path.dirname(__file__), "..", "parallax_titan", "assets")
DEFAULT_CORPUS = os.path.join(ASSETS, "corpus", "train.jsonl.gz")
DEFAULT_OUT = os.path.join(ASSETS, "tokenizer", "tiny")


def iter_contents(path: str):
    """Yield the ``content`` field of each JSONL(.gz) record, in file order."""
    with gzip.open(path, "rt", encoding="utf-8") as f:
        for line in f:
            yield json.loads(line)["content"]


def train_tokenizer(corpus: str, vocab_size: int) -> Tokenizer:
    """Train a byte-level BPE whose id 0 is ``<|endoftext|>``; returns the Tokenizer."""
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=2,
        special_tokens=[EOS_TOKEN],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(iter_contents(corpus), trainer=trainer)
    return tokenizer


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--corpus", default=DEFAULT_CORPUS)
    parser.add_argument("--out-dir", default=DEFAULT_OUT)
    parser.add_argument("--vocab-size", type=int, default=4096)
    args = parser.parse_args()
    tokenizer = train_tokenizer(args.corpus, args.vocab_size)
    os.makedirs(args.out_dir, exist_ok=True)
    tokenizer.save(os.path.join(args.out_dir, "tokenizer.json"))
    write_tokenizer_config(args.out_dir)
    print(f"vocab {tokenizer.get_vocab_size()}, {EOS_TOKEN} = {tokenizer.token_to_id(EOS_TOKEN)}, "
          f"written to {args.out_dir}")


if __name__ == "__main__":
    main()
