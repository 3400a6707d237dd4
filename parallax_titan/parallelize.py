"""Parallelism for the Parallax model family: activation checkpointing, compile and FSDP2.

Mirrors TorchTitan's ``parallelize_qwen3`` and reuses its building blocks, with two changes:
tied embeddings share one FSDP group with the final norm and LM head (torch 2.13 rejects a
parameter shared across FSDP groups), and the CPU path reduces with plain sums (gloo).
Tensor, pipeline and context parallelism are rejected up front by config validation.
"""

from __future__ import annotations

import torch
from torch.distributed.fsdp import CPUOffloadPolicy, MixedPrecisionPolicy, fully_shard
from torchtitan.config import TORCH_DTYPE_MAP
from torchtitan.distributed.activation_checkpoint import apply_ac
from torchtitan.models.llama3.infra.parallelize import apply_ddp, disable_fsdp_gradient_division
from torchtitan.models.llama4.infra.parallelize import apply_compile
from torchtitan.tools.logging import logger

import kernels.parallax.ops  # noqa: F401  (registers torch.ops.parallax_titan.*)
from parallax_titan.compat import force_sum_reductions, on_cpu, qwen3_sac_save_list
from parallax_titan.mixers import FlaMixer

# Selective op-level activation checkpointing keeps what TorchTitan's Qwen3 keeps (matmuls,
# attention kernels, ...) and, like SDPA's outputs, the fused Parallax attention's outputs.
OP_SAC_SAVE_LIST = qwen3_sac_save_list() | {torch.ops.parallax_titan.attention_fwd.default}


def parallelize_parallax(model: torch.nn.Module, parallel_dims, job_config) -> torch.nn.Module:
    """Apply activation checkpointing, ``torch.compile`` per block and FSDP2/DDP, in that order."""
    compile_model = job_config.compile.enable and "model" in job_config.compile.components
    if job_config.activation_checkpoint.mode != "none":
        apply_ac(
            model,
            job_config.activation_checkpoint,
            model_compile_enabled=compile_model,
            op_sac_save_list=OP_SAC_SAVE_LIST,
            base_folder=job_config.job.dump_folder,
        )
    if compile_model:
        if any(isinstance(block.attention, FlaMixer) for block in _blocks(model)):
            compile_around_mixer(model, job_config.compile.backend)
        else:
            apply_compile(model, job_config.compile, False)
    if parallel_dims.fsdp_enabled:
        names = ["dp_replicate", "fsdp"] if parallel_dims.dp_replicate_enabled else ["fsdp"]
        apply_fsdp(model, parallel_dims.get_mesh(names), job_config)
        logger.info("Applied FSDP2 to the model")
    elif parallel_dims.dp_replicate_enabled:
        apply_ddp(model, parallel_dims.get_mesh("dp_replicate"), enable_compile=compile_model)
    return model


def _blocks(model: torch.nn.Module):
    """The transformer blocks, unwrapped from activation-checkpoint wrappers."""
    for block in model.layers.values():
        yield getattr(block, "_checkpoint_wrapped_module", block)


def compile_around_mixer(model: torch.nn.Module, backend: str) -> None:
    """``torch.compile`` (fullgraph) every child of every block except its sequence mixer.

    fla's Triton autograd functions cannot be traced, and TorchTitan compiles whole blocks with
    fullgraph=True (a graph break is an error), so blocks with an fla mixer compile their norms
    and MLP separately and run the mixer eagerly, as TorchTitan does around MoE experts.
    """
    for block in _blocks(model):
        for name, child in list(block.named_children()):
            if name != "attention":
                setattr(block, name, torch.compile(child, backend=backend, fullgraph=True))


def apply_fsdp(model: torch.nn.Module, dp_mesh, job_config) -> None:
    """Shard each block, the embedding and the head with FSDP2 (tied weights in one group)."""
    training = job_config.training
    config = {
        "mesh": dp_mesh,
        "mp_policy": MixedPrecisionPolicy(
            param_dtype=TORCH_DTYPE_MAP[training.mixed_precision_param],
            reduce_dtype=TORCH_DTYPE_MAP[training.mixed_precision_reduce],
        ),
    }
    if training.enable_cpu_offload:
        config["offload_policy"] = CPUOffloadPolicy()
    reshard = job_config.parallelism.fsdp_reshard_after_forward != "never"
    if model.model_args.enable_weight_tying:
        fully_shard([model.tok_embeddings, model.norm, model.output], **config, reshard_after_forward=reshard)
    else:
        fully_shard(model.tok_embeddings, **config, reshard_after_forward=reshard)
    for block in model.layers.values():
        fully_shard(block, **config, reshard_after_forward=reshard)
    if not model.model_args.enable_weight_tying:
        last = job_config.parallelism.fsdp_reshard_after_forward == "always"
        fully_shard([model.norm, model.output], **config, reshard_after_forward=last)
    fully_shard(model, **config)
    # The trainer divides the summed loss by the global token count itself.
    disable_fsdp_gradient_division(model)
    if on_cpu():
        force_sum_reductions(model)
