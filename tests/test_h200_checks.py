"""scripts/h200_checks.sh: rejects unknown checks up front; runs checks, records their exit status
and packs one tarball (on CPU the attention benchmark exits 1 at once: it needs CUDA)."""

import os
import signal
import subprocess
import sys
import tarfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _run(tmp_path, *args, **extra_env):
    env = {**os.environ, "OUT": str(tmp_path), "NGPU": "1",
           "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}", **extra_env}
    return subprocess.run(["bash", str(ROOT / "scripts/h200_checks.sh"), *args], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=120)


def test_unknown_check_is_rejected_before_anything_runs(tmp_path):
    result = _run(tmp_path, "30", "attention", "bogus")
    assert result.returncode == 2 and "unknown check 'bogus'" in result.stdout
    assert not (tmp_path / "h200_checks").exists()


def test_bad_rounds_are_rejected_before_anything_runs(tmp_path):
    for rounds in ("0", "two", "-1", "1.5"):
        result = _run(tmp_path, "30", "throughput", ROUNDS=rounds)
        assert result.returncode == 2 and f"ROUNDS={rounds}: expected a number of rounds >= 1" in result.stderr
        assert not (tmp_path / "h200_checks").exists()


def test_checks_run_and_land_in_one_tarball(tmp_path):
    result = _run(tmp_path, "60", "attention")
    assert "attention: exit 1" in result.stdout  # needs a CUDA GPU
    with tarfile.open(tmp_path / "h200_checks" / "h200_checks.tgz") as tar:
        names = set(tar.getnames())
    assert {"./attention.log", "./status.txt"} <= names


def test_a_call_killed_mid_check_still_returns_the_checks_already_done(tmp_path):
    """The tarball is packed after every check: killing the script while `optimizers` hangs still
    leaves attention.log (done before) in it."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    fake = bin_dir / "python3"
    fake.write_text(f'#!/bin/sh\ncase "$*" in *scripts.bench.optimizers*) exec sleep 60 ;; esac\nexec {sys.executable} "$@"\n')
    fake.chmod(0o755)
    env = {**os.environ, "OUT": str(tmp_path), "NGPU": "1", "PATH": f"{bin_dir}:{os.environ['PATH']}"}
    proc = subprocess.Popen(["bash", str(ROOT / "scripts/h200_checks.sh"), "90", "attention", "optimizers"],
                            cwd=ROOT, env=env, stdout=subprocess.PIPE, text=True, start_new_session=True)
    tarball = tmp_path / "h200_checks" / "h200_checks.tgz"
    try:
        for _ in range(120):
            if tarball.exists():
                break
            time.sleep(0.5)
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    with tarfile.open(tarball) as tar:
        names = set(tar.getnames())
    assert {"./attention.log", "./status.txt"} <= names and "./optimizers.log" not in names


def test_every_check_is_documented_in_the_header():
    """The usage comment at the top lists every check the script accepts."""
    import re

    text = (ROOT / "scripts/h200_checks.sh").read_text()
    known = re.search(r'^known=" (.*) "$', text, re.M).group(1).split()
    header = "".join(line + "\n" for line in text.splitlines() if line.startswith("#"))
    undocumented = [c for c in known if not re.search(rf"^#   (\S+ / )?{re.escape(c)}\s", header, re.M)]
    assert len(known) > 20 and undocumented == []
