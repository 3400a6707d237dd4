"""Two ranks under torchrun leave their gloo process group with :func:`leave_process_group` (test
helper). Each rank writes ``<out_dir>/rank<r>.json``: ``{"entered", "returned"}`` (``time.monotonic()``).

Arguments: mode, out_dir. Modes: ``late`` rank 1 sleeps 1 s before leaving; ``absent`` rank 1 never leaves
(it ends with ``os._exit`` after 3 s) and rank 0 waits at most 0.5 s; ``titan`` rank 0 sleeps
0.3 s before leaving, as TorchTitan's trainer does at the end of training, and no rank writes a file
(the exit code tells).
"""

import json
import os
import sys
import time

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh

from parallax_titan.teardown import leave_process_group

MESHES = []  # kept to the end of the process, as a trainer's device meshes are


def main(mode: str, out_dir: str) -> None:
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    mesh = init_device_mesh("cpu", (2,), mesh_dim_names=("dp_shard",))  # a subgroup, as FSDP2 makes
    MESHES.append(mesh)
    x = torch.ones(1024)
    for _ in range(10):
        dist.all_reduce(x)
        dist.all_reduce(x, group=mesh.get_group())
    if mode == "absent" and rank == 1:
        time.sleep(3)
        os._exit(0)  # leaves without destroying anything
    if (mode, rank) in (("late", 1), ("titan", 0)):
        time.sleep(1.0 if mode == "late" else 0.3)
    entered = time.monotonic()
    leave_process_group(wait_s=0.5 if mode == "absent" else 60.0)
    if mode == "titan":
        return  # exit straight away, as train.py does
    with open(os.path.join(out_dir, f"rank{rank}.json"), "w") as f:
        json.dump({"entered": entered, "returned": time.monotonic()}, f)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
