"""Local clones of Hugging Face dataset repositories (``huggingface-cli download --local-dir``).

A clone's ``README.md`` declares its configs and, per split, the files each reads. ``datasets``
resolves every split of a config before it returns one, and refuses the config when a declared
split matches no file: a clone downloaded with ``--include`` for one split (Ultra-FineWeb's English
parquet files, not its Chinese ones) could not be read at all. Here only the asked split's files are
resolved, and ``datasets`` reads them through its packaged builder for their format.
"""

from __future__ import annotations

import glob
import os
import re

from parallax_titan.data.records import JSONL_SUFFIXES, PARQUET_SUFFIXES, check_file

FORMATS = {".parquet": "parquet", ".jsonl": "json", ".json": "json", ".jsonl.gz": "json", ".csv": "csv"}
_HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")


def is_hub_id(path: str) -> bool:
    """Whether ``path`` reads as a hub dataset id (``owner/name``) rather than a folder path."""
    return bool(_HUB_ID.match(path)) and not os.path.exists(path)


def declared_configs(root: str, key: str) -> list[dict] | None:
    """The ``configs`` list of ``root/README.md``'s metadata, or None without a README or configs.
    ValueError naming ``key`` and the README when its metadata cannot be read (YAML, encoding) or
    ``configs`` is not a list of objects."""
    from huggingface_hub import DatasetCard

    readme = os.path.join(root, "README.md")
    if not os.path.isfile(readme):
        return None
    try:
        configs = DatasetCard.load(readme).data.to_dict().get("configs")
    except Exception as e:  # YAML's, UTF-8's and huggingface_hub's own errors
        raise ValueError(f"{key} = {root!r}: {readme} has metadata that cannot be read ({type(e).__name__}: "
                         f"{e})") from None
    if configs and not (isinstance(configs, list) and all(isinstance(c, dict) for c in configs)):
        raise ValueError(f"{key} = {root!r}: README.md's configs is {configs!r:.80}; expected a list of configs, "
                         "each with config_name and data_files")
    return configs or None


def _patterns(value) -> list[str] | None:
    """A path pattern or a list of them as a list; None for anything else."""
    value = [value] if isinstance(value, str) else value
    return list(value) if isinstance(value, list) and all(isinstance(p, str) for p in value) else None


def _split_patterns(config: dict, split: str, where: str) -> list[str]:
    """The path patterns one config declares for ``split`` (``data_files`` without split names is
    split ``train``, as ``datasets`` reads it). ValueError naming ``where`` (the key, the clone and the
    config) for a ``data_files`` of another shape, or a pattern reaching outside the clone."""
    data_files = config.get("data_files") or []
    patterns = _patterns(data_files)
    if patterns is not None:
        patterns = patterns if split == "train" else []
    elif isinstance(data_files, list) and all(isinstance(e, dict) and _patterns(e.get("path")) is not None
                                              for e in data_files):
        patterns = [p for e in data_files if e.get("split") == split for p in _patterns(e["path"])]
    else:
        raise ValueError(f"{where}: data_files is {data_files!r:.80}; expected a path pattern, a list of them, or a "
                         "list of {split, path}")
    outside = [p for p in patterns if os.path.isabs(p) or ".." in p.replace("\\", "/").split("/")]
    if outside:
        raise ValueError(f"{where}: path pattern {outside[0]!r} reaches outside the clone; expected a path inside it")
    return patterns


def split_files(root: str, config_name: str | None, split: str, key: str) -> list[str]:
    """The files of ``split`` in config ``config_name`` (None: the only config, else ``default``)
    that the clone at ``root`` declares and holds, sorted. Raises ValueError naming ``key`` (the
    option that gave ``root``) when the README declares no such config or split, or when no file
    matches its patterns."""
    configs = declared_configs(root, key)
    if configs is None:
        raise ValueError(f"{key} = {root!r}: no README.md declaring configs; expected a local clone of a Hugging "
                         "Face dataset repository (huggingface-cli download --repo-type dataset --local-dir)")
    name = config_name or (configs[0].get("config_name") if len(configs) == 1 else "default")
    config = next((c for c in configs if c.get("config_name") == name), None)
    if config is None:
        raise ValueError(f"{key} = {root!r}: README.md declares no config {name!r}; it declares "
                         f"{sorted(str(c.get('config_name')) for c in configs)}")
    patterns = _split_patterns(config, split, f"{key} = {root!r}: README.md's config {name!r}")
    if not patterns:
        raise ValueError(f"{key} = {root!r}: config {name!r} declares no split {split!r}")
    files = sorted({f for p in patterns for f in glob.glob(os.path.join(root, p), recursive=True)
                    if os.path.isfile(f)})
    if not files:
        raise ValueError(f"{key} = {root!r}: no file matches split {split!r} of config {name!r} ({patterns}); "
                         "expected the split's files downloaded into the clone")
    formats = {file_format(f, key) for f in files}
    if len(formats) > 1:
        raise ValueError(f"{key} = {root!r}: split {split!r} mixes file formats {sorted(formats)}; expected one")
    return files


def file_format(path: str, key: str) -> str:
    """The ``datasets`` packaged builder that reads ``path`` (by its extension)."""
    for ext, builder in FORMATS.items():
        if path.endswith(ext):
            return builder
    raise ValueError(f"{key}: {path!r} is not one of the formats {sorted(FORMATS)}")


def checked_split_files(root: str, config_name: str | None, split: str, key: str, skip_bad: bool = False) -> list[str]:
    """:func:`split_files`, each parquet or JSONL file checked as a ``local`` data file is
    (:func:`~parallax_titan.data.records.check_file`: a readable footer, or a first good record, with
    a string ``content``), so that a partial download is named before the reading starts rather than
    when the stream reaches it. ValueError naming ``key``, the clone and the file."""
    files = split_files(root, config_name, split, key)
    for path in files:
        if path.endswith(PARQUET_SUFFIXES + JSONL_SUFFIXES):
            try:
                check_file(path, skip_bad)
            except ValueError as e:
                raise ValueError(f"{key} = {root!r}: {e}") from None
    return files


def load_split(root: str, config_name: str | None, split: str, key: str):
    """``split`` of the clone at ``root`` as a streamed ``datasets.IterableDataset`` (one shard per
    file, in :func:`split_files` order)."""
    from datasets import load_dataset

    files = split_files(root, config_name, split, key)
    return load_dataset(file_format(files[0], key), data_files={split: files}, split=split, streaming=True)
