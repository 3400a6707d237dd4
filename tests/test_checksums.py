"""Checkpoint manifests: per-chunk digests against hashlib, and every kind of damage named by file."""

from __future__ import annotations

import hashlib
import json
import os
import re

import pytest

from parallax_titan.checksums import (
    MANIFEST_FILE, content_problems, default_algorithm, digest_files, read_manifest, size_problems, write_manifest)

CHUNK = 1024


@pytest.fixture
def folder(tmp_path):
    """Three files: 2.5 chunks, exactly one chunk, empty."""
    (tmp_path / "a.distcp").write_bytes(os.urandom(2 * CHUNK + 512))
    (tmp_path / "b.distcp").write_bytes(os.urandom(CHUNK))
    (tmp_path / ".metadata").write_bytes(b"")
    return tmp_path


def manifest_of(folder, algorithm="blake2b_128", threads=2):
    names = ["a.distcp", "b.distcp", ".metadata"]
    write_manifest(str(folder), digest_files(str(folder), names, threads, algorithm, CHUNK), algorithm, CHUNK)
    return read_manifest(str(folder))


def test_chunk_digests_are_blake2b_of_each_chunk(folder):
    """Independent reference: hashlib over slices of the bytes read back."""
    manifest = manifest_of(folder)
    data = (folder / "a.distcp").read_bytes()
    expected = [hashlib.blake2b(data[k:k + CHUNK], digest_size=16).hexdigest() for k in range(0, len(data), CHUNK)]
    assert manifest.files["a.distcp"].digests == tuple(expected) and len(expected) == 3
    assert manifest.files["a.distcp"].size == 2 * CHUNK + 512
    assert manifest.files[".metadata"].digests == () and manifest.files[".metadata"].size == 0
    on_disk = json.loads((folder / MANIFEST_FILE).read_text())
    assert on_disk["algorithm"] == "blake2b_128" and on_disk["chunk_bytes"] == CHUNK


def test_threads_do_not_change_the_digests(folder):
    one = digest_files(str(folder), ["a.distcp", "b.distcp"], 1, "blake2b_128", CHUNK)
    four = digest_files(str(folder), ["a.distcp", "b.distcp"], 4, "blake2b_128", CHUNK)
    assert one == four


def test_xxh3_is_the_default_when_installed(folder):
    xxhash = pytest.importorskip("xxhash")
    assert default_algorithm() == "xxh3_128"
    data = (folder / "b.distcp").read_bytes()
    entry = digest_files(str(folder), ["b.distcp"], 1, "xxh3_128", CHUNK)["b.distcp"]
    assert entry.digests == (xxhash.xxh3_128(data).hexdigest(),)


def test_intact_files_have_no_problems(folder):
    manifest = manifest_of(folder)
    assert content_problems(str(folder), manifest, threads=3) == []
    assert size_problems(str(folder), manifest) == []


def test_one_kilobyte_overwritten_names_the_file_and_bytes(folder):
    manifest = manifest_of(folder)
    with open(folder / "a.distcp", "r+b") as f:
        f.seek(CHUNK + 100)
        f.write(b"\0" * 1000)
    assert size_problems(str(folder), manifest) == []  # same size: only the contents tell
    (problem,) = content_problems(str(folder), manifest)
    assert problem == (f"{folder / 'a.distcp'}: bytes {CHUNK}-{2 * CHUNK} differ from their blake2b_128 checksum "
                       f"in {MANIFEST_FILE} (corrupted)")


def test_truncated_missing_and_longer_files_are_named_without_reading_them(folder):
    manifest = manifest_of(folder)
    os.truncate(folder / "a.distcp", 700)
    os.remove(folder / "b.distcp")
    (folder / ".metadata").write_bytes(b"x")
    expected = [f"{folder / '.metadata'}: 1 bytes, {MANIFEST_FILE} lists 0 (longer than written)",
                f"{folder / 'a.distcp'}: 700 bytes, {MANIFEST_FILE} lists {2 * CHUNK + 512} (truncated)",
                f"{folder / 'b.distcp'}: missing (listed in {MANIFEST_FILE})"]
    assert size_problems(str(folder), manifest) == expected
    assert content_problems(str(folder), manifest) == expected
    assert content_problems(str(folder), manifest, names=["a.distcp"]) == expected[1:2]


def test_manifest_errors_name_the_path(folder):
    with pytest.raises(ValueError, match=f"'{folder / MANIFEST_FILE}' does not exist"):
        read_manifest(str(folder))
    (folder / MANIFEST_FILE).write_text("{not json")
    with pytest.raises(ValueError, match="is not a readable manifest"):
        read_manifest(str(folder))
    (folder / MANIFEST_FILE).write_text(json.dumps({"format": 99, "algorithm": "x", "chunk_bytes": 1, "files": {}}))
    with pytest.raises(ValueError, match="has format 99"):
        read_manifest(str(folder))


def test_unknown_algorithm_is_refused(folder):
    with pytest.raises(ValueError, match="checksum algorithm 'md5' is unknown"):
        digest_files(str(folder), ["a.distcp"], 1, "md5")


def test_manifest_write_leaves_no_temporary_file(folder):
    manifest_of(folder)
    assert sorted(os.listdir(folder)) == [".metadata", "a.distcp", "b.distcp", MANIFEST_FILE]


@pytest.mark.parametrize("name", ["../a.distcp", "/etc/hostname", "sub/a.distcp"])
def test_manifest_listing_files_outside_its_folder_is_refused(folder, name):
    """A listed path was hashed wherever it led, outside the checkpoint folder."""
    manifest_of(folder)
    data = json.loads((folder / MANIFEST_FILE).read_text())
    data["files"][name] = data["files"].pop("b.distcp")
    (folder / MANIFEST_FILE).write_text(json.dumps(data))
    path = str(folder / MANIFEST_FILE)
    with pytest.raises(ValueError, match=re.escape(f"{path!r} lists {name!r}; expected the names of files in its own")):
        read_manifest(str(folder))


def test_manifest_with_an_unknown_algorithm_is_named(folder):
    """It was read, and the check that hashed with it raised a ValueError naming no file."""
    manifest_of(folder)
    data = json.loads((folder / MANIFEST_FILE).read_text())
    (folder / MANIFEST_FILE).write_text(json.dumps({**data, "algorithm": "md5"}))
    with pytest.raises(ValueError, match=re.escape(f"{str(folder / MANIFEST_FILE)!r} has algorithm 'md5'; expected "
                                                   "one of xxh3_128, blake2b_128")):
        read_manifest(str(folder))


def test_listed_file_that_is_a_folder_is_named_as_one(folder):
    """It was reported by the folder's own size, as a file longer than written."""
    manifest = manifest_of(folder)
    os.remove(folder / "b.distcp")
    (folder / "b.distcp").mkdir()
    assert size_problems(str(folder), manifest) == [
        f"{folder / 'b.distcp'}: a folder or a broken link, not a file (listed in {MANIFEST_FILE})"]
