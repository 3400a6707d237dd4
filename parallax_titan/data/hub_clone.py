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

FORMATS = {".parquet": "parquet", ".jsonl": "json", ".json": "json", ".jsonl.gz": "json", ".csv": "csv"}
_HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")


def is_hub_id(path: str) -> bool:
    """Whether ``path`` reads as a hub dataset id (``owner/name``) rather than a folder path."""
    return bool(_HUB_ID.match(path)) and not os.path.exists(path)


def declared_configs(root: str) -> list[dict] | None:
    """The ``configs`` list of ``root/README.md``'s metadata, or None without a README or configs."""
    from huggingface_hub import DatasetCard

    readme = os.path.join(root, "README.md")
    if not os.path.isfile(readme):
        return None
    configs = DatasetCard.load(readme).data.to_dict().get("configs")
    return configs or None


def _split_patterns(config: dict, split: str) -> list[str]:
    """The path patterns one config declares for ``split`` (``data_files`` without split names is
    split ``train``, as ``datasets`` reads it)."""
    data_files = config.get("data_files") or []
    data_files = [data_files] if isinstance(data_files, str) else list(data_files)
    if all(isinstance(entry, str) for entry in data_files):
        return data_files if split == "train" else []
    patterns = []
    for entry in data_files:
        if isinstance(entry, dict) and entry.get("split") == split:
            path = entry.get("path") or []
            patterns += [path] if isinstance(path, str) else list(path)
    return patterns


def split_files(root: str, config_name: str | None, split: str, key: str) -> list[str]:
    """The files of ``split`` in config ``config_name`` (None: the only config, else ``default``)
    that the clone at ``root`` declares and holds, sorted. Raises ValueError naming ``key`` (the
    option that gave ``root``) when the README declares no such config or split, or when no file
    matches its patterns."""
    configs = declared_configs(root)
    if configs is None:
        raise ValueError(f"{key} = {root!r}: no README.md declaring configs; expected a local clone of a Hugging "
                         "Face dataset repository (huggingface-cli download --repo-type dataset --local-dir)")
    name = config_name or (configs[0].get("config_name") if len(configs) == 1 else "default")
    config = next((c for c in configs if c.get("config_name") == name), None)
    if config is None:
        raise ValueError(f"{key} = {root!r}: README.md declares no config {name!r}; it declares "
                         f"{sorted(str(c.get('config_name')) for c in configs)}")
    patterns = _split_patterns(config, split)
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


def load_split(root: str, config_name: str | None, split: str, key: str):
    """``split`` of the clone at ``root`` as a streamed ``datasets.IterableDataset`` (one shard per
    file, in :func:`split_files` order)."""
    from datasets import load_dataset

    files = split_files(root, config_name, split, key)
    return load_dataset(file_format(files[0], key), data_files={split: files}, split=split, streaming=True)
