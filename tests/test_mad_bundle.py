"""eval.mad.bundle: partial run states packed into bounded tar files and back."""

import os
import tarfile

import pytest

from eval.mad import bundle
from eval.mad.runner import PARTIAL


def _states(out_dir, sizes):
    folder = os.path.join(out_dir, PARTIAL)
    os.makedirs(folder)
    contents = {}
    for i, size in enumerate(sizes):
        name = f"run{i}.pt"
        contents[name] = os.urandom(size)
        with open(os.path.join(folder, name), "wb") as f:
            f.write(contents[name])
    return contents


def test_pack_groups_within_the_bound_and_unpack_restores_every_byte(tmp_path):
    contents = _states(tmp_path, [400, 300, 500, 2000, 100])
    tars = bundle.pack(str(tmp_path), max_bytes=1000)
    # in name order: 400 + 300 | 500 | 2000 (alone: larger than the bound) | 100
    members = [sorted(tarfile.open(t).getnames()) for t in tars]
    assert members == [["run0.pt", "run1.pt"], ["run2.pt"], ["run3.pt"], ["run4.pt"]]
    assert not (tmp_path / PARTIAL).exists()
    restored = bundle.unpack(str(tmp_path))
    assert sorted(os.path.basename(p) for p in restored) == sorted(contents)
    for name, data in contents.items():
        assert (tmp_path / PARTIAL / name).read_bytes() == data
    assert not list(tmp_path.glob(bundle.TAR_PATTERN))


def test_pack_replaces_the_tars_of_an_earlier_call(tmp_path):
    """An earlier tar's state of the same run is replaced by partial/'s; the tar file goes."""
    contents = _states(tmp_path, [10])
    older = tmp_path / "older" / "run0.pt"
    older.parent.mkdir()
    older.write_bytes(b"older state")
    with tarfile.open(tmp_path / "partial_7.tar", "w") as tar:
        tar.add(older, arcname="run0.pt")
    tars = bundle.pack(str(tmp_path), max_bytes=100)
    assert [os.path.basename(t) for t in tars] == ["partial_1.tar"]
    assert sorted(p.name for p in tmp_path.glob(bundle.TAR_PATTERN)) == ["partial_1.tar"]
    bundle.unpack(str(tmp_path))
    assert (tmp_path / PARTIAL / "run0.pt").read_bytes() == contents["run0.pt"]


def test_unpack_refuses_a_tar_with_a_path_outside_the_folder(tmp_path):
    evil = tmp_path / "evil.pt"
    evil.write_bytes(b"x")
    with tarfile.open(tmp_path / "partial_1.tar", "w") as tar:
        tar.add(evil, arcname="../evil.pt")
    with pytest.raises(ValueError, match="partial_1.tar holds '../evil.pt'"):
        bundle.unpack(str(tmp_path))


def test_pack_refuses_a_bound_below_one_byte(tmp_path):
    with pytest.raises(ValueError, match="max_bytes=0"):
        bundle.pack(str(tmp_path), max_bytes=0)


def test_command_line_round_trip(tmp_path, capsys):
    contents = _states(tmp_path, [50, 60])
    bundle.main(["pack", str(tmp_path), "--max-mib", "1"])
    assert "pack: 1 file(s)" in capsys.readouterr().out
    bundle.main(["unpack", str(tmp_path)])
    assert sorted(os.listdir(tmp_path / PARTIAL)) == sorted(contents)
