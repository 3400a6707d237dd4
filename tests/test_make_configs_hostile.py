"""scripts/make_configs.py against a configs/ folder that holds more than its own files, and a
write that fails part-way."""

from __future__ import annotations

import os

import pytest

import scripts.make_configs as make_configs
from tests._output_folders import full_disk


@pytest.fixture
def root(tmp_path, monkeypatch):
    """An empty repository root for the script to write its configs into."""
    monkeypatch.setattr(make_configs, "ROOT", str(tmp_path))
    return tmp_path


def test_a_users_config_under_configs_is_kept(root):
    """Every TOML under configs/ but the hand-written ones and mad/ was taken for a config the script
    no longer generates: a run config of the user's there was deleted (and --check asked for the
    run that deletes it)."""
    mine = root / "configs" / "paper" / "0.6B" / "my_run.toml"
    mine.parent.mkdir(parents=True)
    mine.write_text('[training]\nsteps = 5\n')
    retired = root / "configs" / "ablations" / "retired.toml"
    retired.parent.mkdir(parents=True)
    retired.write_text(make_configs.GENERATED + "\n[training]\nsteps = 5\n")
    assert make_configs.main([]) == 0
    assert mine.read_text() == '[training]\nsteps = 5\n'
    assert not retired.exists()  # written by the script, and no longer generated
    assert make_configs.main(["--check"]) == 0


def test_a_failed_rewrite_leaves_the_earlier_file_whole(root):
    """Each config was opened over the earlier one: a write that failed part-way (a full disk, a
    kill) left it truncated."""
    assert make_configs.main([]) == 0
    path = root / "configs" / "README.md"
    earlier = path.read_text() + "| an earlier row |\n"
    path.write_text(earlier)
    with full_disk(1000), pytest.raises(OSError):
        make_configs.main([])
    assert path.read_text() == earlier
    assert [name for name in os.listdir(path.parent) if name.startswith(".")] == []
