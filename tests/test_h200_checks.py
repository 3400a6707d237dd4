"""scripts/h200_checks.sh: rejects unknown checks up front; runs checks, records their exit status
and packs one tarball (on CPU the attention benchmark exits 1 at once: it needs CUDA)."""

import os
import subprocess
import sys
import tarfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _run(tmp_path, *args):
    env = {**os.environ, "OUT": str(tmp_path), "NGPU": "1",
           "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}"}
    return subprocess.run(["bash", str(ROOT / "scripts/h200_checks.sh"), *args], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=120)


def test_unknown_check_is_rejected_before_anything_runs(tmp_path):
    result = _run(tmp_path, "30", "attention", "bogus")
    assert result.returncode == 2 and "unknown check 'bogus'" in result.stdout
    assert not (tmp_path / "h200_checks").exists()


def test_checks_run_and_land_in_one_tarball(tmp_path):
    result = _run(tmp_path, "60", "attention")
    assert "attention: exit 1" in result.stdout  # needs a CUDA GPU
    with tarfile.open(tmp_path / "h200_checks" / "h200_checks.tgz") as tar:
        names = set(tar.getnames())
    assert {"./attention.log", "./status.txt"} <= names
