"""Tokenizers for pretraining: TorchTitan's HuggingFaceTokenizer with our document convention.

Convention (SPEC section 4): every document is encoded as its tokens followed by
exactly one ``<|endoftext|>``; there is no BOS token. ``tokenizer.eos_id`` is the
``<|endoftext|>`` id (151643 for Qwen3), which TorchTitan's document masking uses.

Two assets follow it: the real Qwen3 tokenizer (``assets/tokenizer/qwen3``,
fetched by ``scripts/get_tokenizer.py``) and a tiny 4096-token BPE committed at
``parallax_titan/assets/tokenizer/tiny`` for CPU runs and tests.
"""

import functools
import hashlib
import json
import os

import numpy as np
from tokenizers import Tokenizer
from torchtitan.components.tokenizer import HuggingFaceTokenizer
from torchtitan.tools.logging import logger

from parallax_titan.atomic import write_text

EOS_TOKEN = "<|endoftext|>"
TINY_TOKENIZER_PATH = os.path.join(os.path.dirname(__file__), "assets", "tokenizer", "tiny")
QWEN3_TOKENIZER_PATH = os.path.join("assets", "tokenizer", "qwen3")
_FETCH_HINT = (
    "run `python scripts/get_tokenizer.py` to fetch the Qwen3 tokenizer into "
    f"{QWEN3_TOKENIZER_PATH}, or use the tiny test tokenizer at {TINY_TOKENIZER_PATH}"
)

# Read by TorchTitan's HuggingFaceTokenizer (and by transformers): eos is the
# end-of-document token, no BOS, and nothing is added implicitly.
TOKENIZER_CONFIG = {
    "bos_token": None,
    "eos_token": EOS_TOKEN,
    "pad_token": EOS_TOKEN,
    "add_bos_token": False,
    "add_eos_token": False,
}


def write_tokenizer_config(directory: str) -> str:
    """Write our pretraining ``tokenizer_config.json`` into ``directory``; returns its path."""
    path = os.path.join(directory, "tokenizer_config.json")
    write_text(path, json.dumps(TOKENIZER_CONFIG, indent=2) + "\n")
    return path


def check_tokenizer_path(path: str | None, key: str = "model.hf_assets_path") -> str:
    """Check that ``path`` (the value of ``key``: ``model.hf_assets_path``, or a command's flag)
    holds a ``tokenizer.json``.

    Cheap (no tokenizer is loaded), for validating a config early. Returns the path.
    Raises ValueError naming the key, the value and how to get the tokenizer.
    """
    if not path:
        raise ValueError(f"{key} is not set (got {path!r}); {_FETCH_HINT}")
    if not os.path.isdir(path):
        raise ValueError(f"{key} = {path!r} is not a directory; {_FETCH_HINT}")
    file = os.path.join(path, "tokenizer.json")
    if os.path.lexists(file) and not os.path.isfile(file):
        raise ValueError(f"{key} = {path!r}: {file} is a folder or a broken link; expected the tokenizer file; "
                         f"{_FETCH_HINT}")
    if not os.path.isfile(file):
        raise ValueError(
            f"{key} = {path!r} has no tokenizer.json "
            f"(found {sorted(os.listdir(path))}); {_FETCH_HINT}"
        )
    return path


def tokenizer_sha256(path: str) -> str:
    """Hex sha256 of ``path``/tokenizer.json's bytes: the tokenizer's identity in pre-tokenized manifests."""
    with open(os.path.join(check_tokenizer_path(path), "tokenizer.json"), "rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


def load_tokenizer_json(path: str) -> Tokenizer:
    """``path``/tokenizer.json as a ``tokenizers.Tokenizer``; ValueError naming the file when it
    cannot be parsed (a truncated or foreign file)."""
    file = os.path.join(check_tokenizer_path(path), "tokenizer.json")
    try:
        return Tokenizer.from_file(file)
    except Exception as e:  # the Rust parser raises plain Exception subclasses with its own text
        raise ValueError(f"model.hf_assets_path = {path!r}: {file} is not a readable tokenizer ({e})") from None


@functools.lru_cache(maxsize=16)
def _vocab_size(file: str, mtime_ns: int, size: int) -> int:
    """Token ids of the tokenizer.json ``file`` (special tokens included); cached per file version
    (the key's mtime and size), since parsing the Qwen3 file takes a quarter second and every config
    check asks (a sweep loads dozens of configs)."""
    return load_tokenizer_json(os.path.dirname(file)).get_vocab_size(with_added_tokens=True)


def check_tokenizer_vocab(path: str, model_vocab_size: int) -> None:
    """The model's embedding rows must cover every token id of the tokenizer at ``path``
    (special tokens included); ValueError naming both sizes otherwise."""
    file = os.path.join(check_tokenizer_path(path), "tokenizer.json")
    stat = os.stat(file)
    tokenizer_vocab = _vocab_size(file, stat.st_mtime_ns, stat.st_size)
    if model_vocab_size < tokenizer_vocab:
        raise ValueError(f"model.vocab_size: {model_vocab_size} is smaller than the vocabulary of the tokenizer at "
                         f"model.hf_assets_path = {path!r} ({tokenizer_vocab} tokens); expected at least "
                         f"{tokenizer_vocab}")


def encode_documents(tokenizer: Tokenizer, texts: list[str], eos_id: int) -> list[np.ndarray]:
    """Each text encoded by ``tokenizer`` (special-token strings as plain text, nothing added)
    followed by ``eos_id``, as uint32 arrays: the pretraining convention, in one batch call."""
    tokenizer.encode_special_tokens = True
    encode = getattr(tokenizer, "encode_batch_fast", tokenizer.encode_batch)
    return [np.array(e.ids + [eos_id], dtype=np.uint32) for e in encode(texts, add_special_tokens=False)]


class PretrainTokenizer(HuggingFaceTokenizer):
    """HuggingFaceTokenizer whose eos is ``<|endoftext|>`` and which has no BOS.

    ``encode(text, add_bos=True, add_eos=True)`` (what TorchTitan's text dataset
    calls) returns ``ids(text) + [eos_id]``. Special-token strings inside the text
    are encoded as plain text, so a document can never contain a second
    end-of-document token. The end-of-document choice is enforced here, whatever
    the asset's tokenizer_config.json says (Qwen's instruct config uses <|im_end|>).
    """

    def __init__(self, tokenizer_path: str):
        self._parsed = load_tokenizer_json(tokenizer_path)  # a clear error naming the file, before the config's
        try:
            super().__init__(tokenizer_path)
        except (OSError, ValueError, TypeError, AttributeError) as e:  # tokenizer.json parsed: the config failed
            config = os.path.join(tokenizer_path, "tokenizer_config.json")
            raise ValueError(f"model.hf_assets_path = {tokenizer_path!r}: {config} cannot be read "
                             f"({type(e).__name__}: {e}); expected a JSON object whose bos_token and eos_token are "
                             "strings, {\"content\": ...} objects or null, or no such file") from None
        eos_id = self.tokenizer.token_to_id(EOS_TOKEN)
        if eos_id is None:
            raise ValueError(
                f"model.hf_assets_path = {tokenizer_path!r}: tokenizer.json has no {EOS_TOKEN} token"
            )
        if self.eos_token not in (None, EOS_TOKEN) or self.bos_token is not None:
            logger.warning(
                f"{tokenizer_path}/tokenizer_config.json declares bos={self.bos_token!r}, "
                f"eos={self.eos_token!r}; pretraining uses no BOS and eos={EOS_TOKEN!r}"
            )
        self.eos_token, self.eos_id = EOS_TOKEN, eos_id
        self.bos_token, self.bos_id = None, None
        if self.tokenizer.encode("").ids:
            raise ValueError(
                f"model.hf_assets_path = {tokenizer_path!r}: tokenizer.json adds tokens to every "
                f"sequence ({self.tokenizer.encode('').ids}); expected none (no BOS, eos added explicitly)"
            )
        self.hf_adds_bos = self.hf_adds_eos = False
        self.tokenizer.encode_special_tokens = True

    def _load_tokenizer_from_path(self, tokenizer_path: str) -> Tokenizer:
        """TorchTitan's loader hook: the tokenizer.json parsed in ``__init__`` (the Qwen3 file takes
        a quarter second to parse; TorchTitan would parse it again)."""
        return self._parsed


def build_tokenizer(job_config) -> PretrainTokenizer:
    """TrainSpec.build_tokenizer_fn: load the tokenizer at ``job_config.model.hf_assets_path``."""
    return PretrainTokenizer(job_config.model.hf_assets_path)
