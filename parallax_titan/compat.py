"""Every use of TorchTitan internals, in one place, each guarded by the pinned version.

TorchTitan 0.2.2 is pinned (requirements.txt). What this module reaches into is not TorchTitan's
public API, so each function first calls :func:`require_pinned_torchtitan`, which fails loudly on
another version instead of misbehaving quietly.

TorchTitan's trainer assumes CUDA. On a CPU-only machine (every developer box and CI) we:

* point TorchTitan's device globals at ``cpu`` (its modules import ``device_type`` and
  ``device_module`` by value, so each importer is patched) with a small CPU device module that
  answers the memory-monitor and seeding calls TorchTitan makes (memory = peak resident size);
* use fp32 parameters (CPUs without bf16 matrix units run bf16 matmuls far slower than fp32);
* make FSDP2 reduce with plain sums, because gloo has no PREMUL_SUM reduce-scatter.

Call :func:`configure_for_host` once, before TorchTitan's Trainer is built.
"""

from __future__ import annotations

import contextlib
import functools
import importlib.metadata
import types
from collections import namedtuple

import torch

TORCHTITAN_VERSION = "0.2.2"


@functools.cache
def require_pinned_torchtitan() -> None:
    """Raise RuntimeError unless the installed TorchTitan is :data:`TORCHTITAN_VERSION`."""
    installed = importlib.metadata.version("torchtitan")
    if installed != TORCHTITAN_VERSION:
        raise RuntimeError(
            f"Parallax-Titan uses TorchTitan {TORCHTITAN_VERSION} internals (parallax_titan/compat.py), but "
            f"torchtitan {installed} is installed; pip install torchtitan=={TORCHTITAN_VERSION}")

_CpuProperties = namedtuple("_CpuProperties", "total_memory")


def _cpu_device_module() -> types.SimpleNamespace:
    """Stand-in for ``torch.cuda`` with the calls TorchTitan makes on its device module."""
    total = _physical_memory_bytes()
    return types.SimpleNamespace(
        set_device=lambda device: None,
        current_device=lambda: 0,
        device_count=lambda: 1,
        is_available=lambda: True,
        synchronize=lambda *a, **k: None,
        empty_cache=lambda: None,
        reset_peak_memory_stats=lambda *a, **k: None,
        memory_stats=_cpu_memory_stats,
        get_device_name=lambda *a, **k: "cpu",
        get_device_properties=lambda *a, **k: _CpuProperties(total),
        manual_seed=torch.manual_seed,
        manual_seed_all=torch.manual_seed,
    )


def _cpu_memory_stats(*args, **kwargs) -> dict[str, int]:
    """TorchTitan's memory-monitor keys, filled with this process's peak resident memory."""
    import resource

    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # KiB on Linux
    return {"active_bytes.all.peak": peak, "reserved_bytes.all.peak": peak, "num_alloc_retries": 0, "num_ooms": 0}


def _physical_memory_bytes() -> int:
    try:
        import os

        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return 1 << 34


def _patch_device_globals(device_type: str, device_module) -> None:
    require_pinned_torchtitan()
    import torchtitan.components.metrics as metrics
    import torchtitan.distributed.parallel_dims as parallel_dims
    import torchtitan.distributed.utils as dist_utils
    import torchtitan.tools.utils as tool_utils

    for module in (tool_utils, metrics, dist_utils, parallel_dims):
        if hasattr(module, "device_type"):
            module.device_type = device_type
        if hasattr(module, "device_module"):
            module.device_module = device_module


def on_cpu() -> bool:
    """True when training runs on the CPU (no CUDA device visible)."""
    return not torch.cuda.is_available()


def configure_for_host(job_config) -> None:
    """Adapt TorchTitan and ``job_config`` to this host; a no-op on CUDA machines."""
    if not on_cpu():
        return
    _patch_device_globals("cpu", _cpu_device_module())
    # bf16 runs ~25x slower than fp32 on the CPU; compiling costs minutes for nothing; float8 needs CUDA
    changes = {"training.mixed_precision_param": "float32", "training.dtype": "float32", "compile.enable": False}
    changed = []
    for key, value in changes.items():
        section, name = key.split(".")
        before = getattr(getattr(job_config, section), name)
        if before != value:
            setattr(getattr(job_config, section), name, value)
            changed.append(f"{key} = {before!r} -> {value!r}")
    if changed:
        from torchtitan.tools.logging import logger

        logger.info(f"no CUDA device: training on the CPU with {', '.join(changed)}")


def force_sum_reductions(model: torch.nn.Module) -> None:
    """Make every FSDP2 module reduce with ReduceOp.SUM (gloo lacks PREMUL_SUM)."""
    from torch.distributed.fsdp import FSDPModule

    for module in model.modules():
        if isinstance(module, FSDPModule):
            module.set_force_sum_reduction_for_comms(True)


def pinned_memory_saves_problem() -> str | None:
    """Why ``checkpoint.async_mode = "async_with_pinned_mem"`` cannot save on this machine (None: it
    can). TorchTitan stages each save into pinned memory with non-blocking copies through one
    ``DefaultStager`` it keeps: torch refuses those copies without CUDA, and torch before 2.13 closes
    the stager after its first save, so the second fails (pytorch/pytorch#183413)."""
    if not torch.cuda.is_available():
        return ("needs a CUDA device (TorchTitan stages each save into pinned memory with non-blocking copies, "
                "which torch refuses on a machine without CUDA at the first save)")
    if torch.__version__ < (2, 13):
        return (f"fails at the second save with torch {torch.__version__} (torch's DefaultStager closes the stager "
                "TorchTitan reuses; fixed in 2.13: pytorch/pytorch#183413)")
    return None


def save_checkpoint_now(checkpointer, step: int) -> None:
    """Write a full checkpoint (model, optimizer, schedules, data position) for ``step`` now,
    whatever the interval; if this run already saved that step, only waits until a background save
    of it is published. ``checkpointer`` is a
    :class:`parallax_titan.checkpointing.ParallaxCheckpointManager`. Uses TorchTitan 0.2.2's
    CheckpointManager internals (there is no public "save now")."""
    from torchtitan.components.checkpoint import AsyncMode

    from parallax_titan.checkpoint_files import step_dir

    require_pinned_torchtitan()
    if not checkpointer.enable:
        return
    checkpointer._async_wait()  # a background save (of this very step too) is published before a stop says so
    if step in checkpointer.saved_steps:
        return
    checkpointer.dcp_save(checkpointer._flattened_model_states_sd(), checkpoint_id=step_dir(checkpointer.folder, step),
                          async_mode=AsyncMode.DISABLED, enable_garbage_collection=True)


@contextlib.contextmanager
def trainer_checkpoint_manager(manager_class):
    """While in this block, TorchTitan 0.2.2's ``Trainer.__init__`` builds ``manager_class`` (same
    arguments as its ``CheckpointManager``) as ``trainer.checkpointer``: the Trainer names the
    class directly, with no hook to pass another."""
    require_pinned_torchtitan()
    import torchtitan.train as titan_train

    original = titan_train.CheckpointManager
    titan_train.CheckpointManager = manager_class
    try:
        yield
    finally:
        titan_train.CheckpointManager = original


def model_converter_names() -> list[str]:
    """The names TorchTitan's model-converter registry knows (``model.converters`` values), sorted."""
    require_pinned_torchtitan()
    import torchtitan.components.quantization  # noqa: F401  (registers the quantization converters)
    from torchtitan.protocols.model_converter import _registry_model_converter_cls

    return sorted(_registry_model_converter_cls)


def qwen3_sac_save_list() -> set:
    """The ops whose outputs TorchTitan's Qwen3 keeps under selective op-level checkpointing."""
    require_pinned_torchtitan()
    from torchtitan.models.qwen3.infra.parallelize import _op_sac_save_list

    return set(_op_sac_save_list)


def schedule_phases(lr_schedulers) -> tuple[int, int, int]:
    """(warmup, stable, decay) step counts of TorchTitan's warmup-stable-decay lr lambda, as it
    computed them from ``[lr_scheduler]`` and ``training.steps`` (read back, not recomputed)."""
    require_pinned_torchtitan()
    keywords = lr_schedulers.schedulers[0].lr_lambdas[0].keywords
    return keywords["warmup_steps"], keywords["stable_steps"], keywords["decay_steps"]
