"""Train the tiny byte-level BPE tokenizer (vocab 4096) on the embedded corpus.

It exists for fast CPU runs and tests; real training uses the Qwen3 tokenizer
(``python -m scripts.get_tokenizer``). Same conventions as Qwen3 for pretraining: the only
special token is ``<|endoftext|>`` (end of document), there is no BOS token and
the tokenizer itself adds nothing (``encode("")`` is empty).

Usage:
    python -m scripts.build_tiny_tokenizer [--corpus FILE] [--out-dir DIR] [--vocab-size N]

The options are checked before the training (exit code 2): ``--vocab-size`` below 257 (the 256 byte
tokens and ``<|endoftext|>``), a ``--corpus`` that is no file, an ``--out-dir`` that is a file, cannot
be written or holds other files than a tokenizer this script wrote. A corpus too small for
``--vocab-size`` tokens writes nothing. ``tokenizer.json`` is written whole.
"""

import argparse
import gzip
import json
import os

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

from parallax_titan.atomic import replacing
from parallax_titan.tokenizer import EOS_TOKEN, write_tokenizer_config

ASSETS = os.path.join(os.path.dirname(__file__), "..", "parallax_titan", "assets")
DEFAULT_CORPUS = os.path.join(ASSETS, "corpus", "train.jsonl.gz")
DEFAULT_OUT = os.path.join(ASSETS, "tokenizer", "tiny")
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json")
MIN_VOCAB = 257  # the byte-level alphabet and <|endoftext|>


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


def vocab_size(text: str) -> int:
    """``--vocab-size`` (argparse type): an int >= :data:`MIN_VOCAB`; BPE never makes fewer tokens, so
    a smaller size would give a tokenizer of :data:`MIN_VOCAB` without a word."""
    if not text.isdigit() or int(text) < MIN_VOCAB:
        raise argparse.ArgumentTypeError(f"{text!r}: expected an int >= {MIN_VOCAB} (the 256 byte tokens and "
                                         f"{EOS_TOKEN})")
    return int(text)


def check_paths(corpus: str, out_dir: str) -> None:
    """ValueError naming the option, before the training: ``--corpus`` is no file, or ``--out-dir`` is a
    file, cannot be written, or holds other files than a tokenizer this script wrote (the Qwen3 one's
    folder has a SOURCE.md beside them)."""
    from parallax_titan.checkpoint_files import check_output_files, check_output_folder  # torch: only when run

    if not os.path.isfile(corpus):
        raise ValueError(f"--corpus: {corpus!r} is not a file; expected a gzipped JSONL corpus whose records have "
                         "a content field")
    check_output_folder(out_dir, "--out-dir", lambda name: name in TOKENIZER_FILES,
                        f"a tiny tokenizer ({', '.join(TOKENIZER_FILES)})", "whose files are replaced")
    check_output_files(out_dir, "--out-dir", TOKENIZER_FILES)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--corpus", default=DEFAULT_CORPUS)
    parser.add_argument("--out-dir", default=DEFAULT_OUT)
    parser.add_argument("--vocab-size", type=vocab_size, default=4096)
    args = parser.parse_args(argv)
    try:
        check_paths(args.corpus, args.out_dir)
    except ValueError as exc:
        parser.error(str(exc))
    try:
        tokenizer = train_tokenizer(args.corpus, args.vocab_size)
    except (OSError, ValueError, KeyError) as exc:  # not gzip, not JSON, a record without content
        parser.error(f"--corpus: {args.corpus!r} cannot be read ({type(exc).__name__}: {exc}); expected a gzipped "
                     "JSONL corpus whose records have a content field")
    if tokenizer.get_vocab_size() < args.vocab_size:  # too few pairs seen twice for more merges
        parser.error(f"--vocab-size {args.vocab_size}: the corpus gives {tokenizer.get_vocab_size()} tokens only; "
                     f"nothing was written (expected at most {tokenizer.get_vocab_size()}, or a larger --corpus)")
    os.makedirs(args.out_dir, exist_ok=True)
    # whole or not at all: a cut tokenizer.json would fail every run that reads it
    with replacing(os.path.join(args.out_dir, "tokenizer.json")) as temporary:
        tokenizer.save(temporary)
    write_tokenizer_config(args.out_dir)
    print(f"vocab {tokenizer.get_vocab_size()}, {EOS_TOKEN} = {tokenizer.token_to_id(EOS_TOKEN)}, "
          f"written to {args.out_dir}")


if __name__ == "__main__":
    main()
