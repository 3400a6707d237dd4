"""Partial run states in and out of a folder that returns few, bounded files.

A GPU machine's output folder comes back only with a few files of a bounded size each, while a
grid keeps one partial state per unfinished run (``runner.PARTIAL``). ``pack`` moves the states of
``out_dir/partial/`` into tar files ``out_dir/partial_<i>.tar`` of at most ``max_bytes`` each (a
state larger than that alone in its tar); ``unpack`` moves them back. Both leave ``out_dir``
holding the states one way only, so a state is never resumed from twice.

    python -m eval.mad.bundle pack|unpack OUT_DIR [--max-mib 15]
"""

from __future__ import annotations

import argparse
import glob
import math
import os
import tarfile

from eval.mad.runner import PARTIAL

TAR_PATTERN = "partial_*.tar"


def _groups(paths: list[str], max_bytes: int) -> list[list[str]]:
    """``paths`` in order, split into runs whose sizes sum to at most ``max_bytes`` (a file larger
    than that forms its own group)."""
    groups: list[list[str]] = []
    size = 0
    for path in paths:
        n = os.path.getsize(path)
        if not groups or size + n > max_bytes:
            groups.append([])
            size = 0
        groups[-1].append(path)
        size += n
    return groups


def pack(out_dir: str, max_bytes: int) -> list[str]:
    """Move ``out_dir/partial/*.pt`` into ``out_dir/partial_<i>.tar`` (replacing earlier tars);
    returns the tar paths. The states of earlier tars are packed too, each unless ``partial/`` holds
    a state of the same run: a second pack, or one after a call that did not unpack, loses none.
    Each tar is written under a temporary name and renamed when complete."""
    if max_bytes < 1:
        raise ValueError(f"bundle.pack: max_bytes={max_bytes!r}; expected an int >= 1")
    folder = os.path.join(out_dir, PARTIAL)
    earlier = sorted(glob.glob(os.path.join(out_dir, TAR_PATTERN)))
    for path in earlier:
        _extract(path, folder, keep=True)
    states = sorted(glob.glob(os.path.join(folder, "*.pt")))
    tars = []
    for i, group in enumerate(_groups(states, max_bytes), 1):
        path = os.path.join(out_dir, f"partial_{i}.tar")
        with tarfile.open(path + ".tmp", "w") as tar:
            for state in group:
                tar.add(state, arcname=os.path.basename(state))
        os.replace(path + ".tmp", path)
        tars.append(path)
    for old in set(earlier) - set(tars):
        os.remove(old)
    for state in states:
        os.remove(state)
    if os.path.isdir(folder) and not os.listdir(folder):
        os.rmdir(folder)  # nothing left to carry back
    return tars


def _extract(path: str, target: str, keep: bool = False) -> list[str]:
    """Extract the states of the tar ``path`` into ``target``, skipping those already there when
    ``keep``; returns their paths. Only plain files at the top of a tar are taken (ValueError)."""
    os.makedirs(target, exist_ok=True)
    states = []
    try:
        tar = tarfile.open(path)
    except tarfile.TarError as exc:
        raise ValueError(f"bundle: {path} is not a tar of states ({exc}); expected one written by pack") from None
    with tar:
        for member in tar.getmembers():
            if not member.isfile() or os.path.basename(member.name) != member.name:
                raise ValueError(f"bundle: {path} holds {member.name!r}; expected plain state files")
            if keep and os.path.exists(os.path.join(target, member.name)):
                continue
            tar.extract(member, target, filter="data")
            states.append(os.path.join(target, member.name))
    return states


def unpack(out_dir: str) -> list[str]:
    """Move the states of ``out_dir/partial_*.tar`` into ``out_dir/partial/`` (deleting the tars);
    returns the state paths. Only plain files at the top of a tar are taken."""
    target = os.path.join(out_dir, PARTIAL)
    os.makedirs(target, exist_ok=True)
    states = []
    for path in sorted(glob.glob(os.path.join(out_dir, TAR_PATTERN))):
        states += _extract(path, target)
        os.remove(path)
    return states


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m eval.mad.bundle", description=__doc__.splitlines()[0])
    parser.add_argument("action", choices=["pack", "unpack"])
    parser.add_argument("out_dir")
    parser.add_argument("--max-mib", type=float, default=15.0, help="largest tar (MiB) when packing")
    args = parser.parse_args(argv)
    if not (math.isfinite(args.max_mib) and args.max_mib * 2**20 >= 1):
        parser.error(f"--max-mib = {args.max_mib}: expected a finite size > 0")
    if not os.path.isdir(args.out_dir):  # a mistyped grid folder: nothing to pack, or a stray partial/ made
        parser.error(f"out_dir = {args.out_dir!r}: not a folder; expected a grid's --out folder")
    try:
        paths = pack(args.out_dir, int(args.max_mib * 2**20)) if args.action == "pack" else unpack(args.out_dir)
    except ValueError as exc:  # a tar that is not one of pack's, named (and left as it was)
        parser.error(str(exc))
    print(f"[mad] {args.action}: {len(paths)} file(s) in {args.out_dir}")


if __name__ == "__main__":
    main()
