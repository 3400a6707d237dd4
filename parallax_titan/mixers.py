"""Sequence mixers other than softmax and Parallax attention, in the attention slot of our Qwen3 block.

``ParallaxModelArgs.mixer`` picks one; the block keeps its norms, SwiGLU MLP and embeddings and only
the attention module changes. Every mixer takes TorchTitan's attention call
``(x, rope_cache, attention_masks, positions)``.

* :data:`FLA_MIXERS`: baselines from flash-linear-attention (fla), :class:`FlaMixer` owning fla's
  layer. These carry position information in their recurrence and short convolutions, so RoPE is
  ignored. fla is optional (``pip install flash-linear-attention==0.6.0``, which pulls
  ``fla-core==0.6.0`` and ``transformers``): :func:`require_fla` gives the install hint, and nothing
  here imports fla until a mixer is built. fla's kernels are Triton kernels and need a CUDA device
  (see docs/mixers.md).
* :data:`FAMILY_MIXERS`: the Parallax family (SPEC sections 1 and 1b, ``kernels.family``): exact
  local-linear attention and the uniform-weight members Value Averaging, Affine Linear Attention and
  Affine MesaNet, with projections named as the attention's (docs/models.md).
"""

from __future__ import annotations

import importlib
import importlib.metadata
import importlib.util
import math
import os
import re
import shutil
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn
from torchtitan.models.qwen3.model.model import apply_rotary_emb
from torchtitan.models.utils import trunc_normal_

import kernels

FLA_VERSION = "0.6.0"
FLA_INSTALL = f"pip install flash-linear-attention=={FLA_VERSION}"

# mixer name -> fla.layers class
FLA_MIXERS = {
    "gated_deltanet": "GatedDeltaNet",
    "kda": "KimiDeltaAttention",
    "mamba2": "Mamba2",
    "mesa_net": "MesaNet",
}
# Mixers whose fla layer accepts packed documents (``cu_seqlens``) for block-causal masks.
VARLEN_MIXERS = ("gated_deltanet", "kda", "mesa_net")
# Output projections get TorchTitan's depth-scaled init std, like ``wo`` and ``w2``/``w3``.
OUTPUT_PROJECTIONS = ("o_proj", "out_proj")


def fla_missing(mixer: str) -> str | None:
    """The error message when ``mixer`` needs fla's layers and they cannot be imported, else None."""
    if mixer not in FLA_MIXERS:
        return None
    try:
        importlib.import_module("fla.layers")
    except ImportError as exc:
        return f"model.name = {mixer!r} needs flash-linear-attention: {FLA_INSTALL} ({exc})"
    return None


# fla 0.6.0 refuses its gated backward kernel ``chunk_bwd_dqkwg`` (used by the gated delta rule)
# on Hopper with these Triton versions (fla issue #640), unless its TileLang backend takes it.
_BAD_TRITON_ON_HOPPER = ("3.4.0", "3.7.1")  # [low, high)


def _triton_version() -> str | None:
    """The installed Triton's ``__version__`` (what fla compares), or None without Triton."""
    try:
        import triton
    except ImportError:
        return None
    return getattr(triton, "__version__", None)


def _version_key(version: str):
    try:
        from packaging.version import Version

        return Version(version)
    except ImportError:  # packaging is not a torch dependency; compare the release numbers
        return tuple(int(n) for n in re.findall(r"\d+", version.split("+")[0])[:3])


def _tilelang_found() -> bool:
    return importlib.util.find_spec("tilelang") is not None


def _nvcc_found() -> bool:
    """fla's ``has_usable_nvcc``: without nvcc, fla skips its TileLang backend and uses Triton."""
    home = os.environ.get("CUDA_HOME") or os.environ.get("CUDA_PATH")
    if home and (Path(home) / "bin" / "nvcc").exists():
        return True
    if shutil.which("nvcc") or Path("/usr/local/cuda/bin/nvcc").exists():
        return True
    try:
        files = importlib.metadata.files("nvidia-cuda-nvcc") or []
    except importlib.metadata.PackageNotFoundError:
        files = []
    return any(f.name == "nvcc" for f in files)


def _tilelang_missing() -> str | None:
    """Why fla would not route ``chunk_bwd_dqkwg`` to TileLang, or None when it would."""
    if not _tilelang_found():
        return "tilelang is not installed"
    if os.environ.get("FLA_DISABLE_BACKEND_DISPATCH") == "1" or os.environ.get("FLA_TILELANG") == "0":
        return "tilelang is installed but switched off (FLA_TILELANG=0 or FLA_DISABLE_BACKEND_DISPATCH=1)"
    if not _nvcc_found():
        return "tilelang is installed but fla finds no nvcc (CUDA_HOME, PATH, /usr/local/cuda), which it needs"
    return None


def fla_hopper_blocker(mixer: str) -> str | None:
    """The error message when fla 0.6.0 would refuse ``mixer``'s backward on this machine, else None.

    fla 0.6.0 raises in the first backward of the gated delta rule (``chunk_bwd_dqkwg`` with a
    gate, fla issue #640) when all of these hold, which this checks before any model is built:
    ``mixer`` is ``gated_deltanet``; CUDA is available and the current device is Hopper (compute
    capability 9.x); Triton is >= 3.4.0 and < 3.7.1; and fla's TileLang backend cannot take the
    kernel (tilelang not importable, switched off by ``FLA_TILELANG=0``, or no nvcc).
    KDA and MesaNet have their own backward kernels without that guard.
    """
    if mixer != "gated_deltanet" or not torch.cuda.is_available():
        return None
    major, minor = torch.cuda.get_device_capability()
    triton = _triton_version()
    if major != 9 or triton is None:
        return None
    low, high = _BAD_TRITON_ON_HOPPER
    if not _version_key(low) <= _version_key(triton) < _version_key(high):
        return None
    why_not_tilelang = _tilelang_missing()
    if why_not_tilelang is None:
        return None
    return (f"model.name = {mixer!r} cannot train on {torch.cuda.get_device_name()} (sm{major}{minor}) with "
            f"triton {triton}: fla {FLA_VERSION} refuses the gated backward kernel chunk_bwd_dqkwg on Hopper "
            f"with triton >= {low}, < {high} (fla issue #640), and {why_not_tilelang}. Fix: install tilelang "
            "(fla then runs that kernel with TileLang; on a machine without network access: "
            "bash scripts/gpu_wheels.sh --tilelang, see docs/mixers.md) or upgrade triton to >= 3.7.1")


def require_fla(mixer: str):
    """The ``fla.layers`` module; raises ImportError with the install command when fla is missing."""
    message = fla_missing(mixer)
    if message:
        raise ImportError(message)
    return importlib.import_module("fla.layers")


def _heads(target: float, per_head: float) -> int:
    return max(1, round(target / per_head))


def fla_settings(mixer: str, dim: int, head_dim: int, n_heads: int, n_kv_heads: int) -> dict:
    """fla constructor arguments of ``mixer`` sized to the softmax attention it replaces.

    The head count is chosen so that the mixer's projections hold as many parameters as
    W_Q, W_K, W_V, W_O of a Qwen3 attention with (dim, head_dim, n_heads, n_kv_heads); the other
    settings are fla's recommended defaults (short conv 4, output gates, expand ratios).
    """
    attn = dim * head_dim * (2 * n_heads + 2 * n_kv_heads)
    if mixer == "gated_deltanet":
        # q, k: d x (H d_h); v, g, o: d x (2 H d_h) -> 8 d d_h per head (fla: H d_h = 0.75 d).
        return {"num_heads": _heads(attn, 8 * dim * head_dim), "head_dim": head_dim, "expand_v": 2.0,
                "use_gate": True, "use_short_conv": True, "conv_size": 4}
    if mixer == "kda":
        # q, k, v, o: 4 d d_h per head, plus the rank-d_h gate projections f and g.
        per_head = head_dim * (4 * dim + 2 * head_dim + 1) + dim
        return {"num_heads": _heads(attn, per_head), "head_dim": head_dim, "expand_v": 1.0,
                "use_short_conv": True, "conv_size": 4}
    if mixer == "mamba2":
        # in/out projections are ~6 d^2 at expand 2, close to attention's 6 d^2 at the paper sizes.
        return {"num_heads": 2 * dim // 64, "head_dim": 64, "expand": 2, "state_size": 128,
                "n_groups": 1, "conv_kernel": 4}
    if mixer == "mesa_net":
        # q, k, v, o: 4 d d_h per head.
        return {"num_heads": _heads(attn, 4 * dim * head_dim), "head_dim": head_dim,
                "use_output_gate": False, "use_short_conv": True, "conv_size": 4,
                "lambda_lower_bound": 0.25}
    raise ValueError(f"mixer: {mixer!r} is not an fla mixer; expected one of {', '.join(FLA_MIXERS)}")


def _cu_seqlens(attention_masks) -> torch.Tensor | None:
    return getattr(attention_masks, "cu_seqlens", None)


class FlaMixer(nn.Module):
    """fla's layer ``mixer`` in the attention slot.

    forward(x (batch, seq, dim), rope_cache, attention_masks, positions) -> (batch, seq, dim) in
    x's dtype. ``attention_masks`` may be :class:`parallax_titan.model.DocumentBoundaries`
    (block-causal over packed documents) for the mixers in :data:`VARLEN_MIXERS`.
    """

    def __init__(self, mixer: str, dim: int, settings: dict, layer_id: int, norm_eps: float):
        super().__init__()
        layers = require_fla(mixer)
        self.mixer = mixer
        self.kwargs = {"hidden_size": dim, "layer_idx": layer_id, "norm_eps": norm_eps, **settings}
        self.layer = getattr(layers, FLA_MIXERS[mixer])(**self.kwargs)

    def forward(self, x, rope_cache=None, attention_masks=None, positions=None):
        if x.device.type != "cuda":
            raise RuntimeError(
                f"mixer {self.mixer!r}: fla's Triton kernels need a CUDA device; got input on {x.device}")
        return self._mix(x, _cu_seqlens(attention_masks))

    def forward_cached(self, x, rope_cache, layer_cache, step):
        """The inference path: x (batch, seq, dim) through fla's layer with its recurrent state.

        ``layer_cache`` is the fla cache object of the whole model (fla's layers find their own
        entry by ``layer_idx``); a prefill starts it, a decode step advances it by one token.
        ``step`` is unused: fla's state carries the positions.
        """
        if x.device.type != "cuda":
            raise RuntimeError(f"mixer {self.mixer!r}: fla's recurrent kernels need a CUDA device; got input on "
                               f"{x.device}")
        return self.layer(x, past_key_values=layer_cache, use_cache=True)[0]

    # Inductor cannot trace fla's Triton autograd functions; the rest of the block still compiles.
    @torch.compiler.disable
    def _mix(self, x: torch.Tensor, cu_seqlens: torch.Tensor | None) -> torch.Tensor:
        if cu_seqlens is None:
            return self.layer(x)[0]
        if self.mixer not in VARLEN_MIXERS:
            raise ValueError(f"parallax.attn_mask_type = 'block_causal' is not supported by mixer {self.mixer!r}; "
                             "use 'causal'")
        bs, seqlen, dim = x.shape
        out = self.layer(x.reshape(1, bs * seqlen, dim), cu_seqlens=cu_seqlens.long())[0]
        return out.reshape(bs, seqlen, dim)

    @torch.no_grad()
    def init_weights(self, init_std: float) -> None:
        """Linear weights: truncated normal (std 0.02; output projection ``init_std``), biases 0.

        Every other parameter (A_log, dt_bias, D, lambda, conv filters, norm weights) takes the
        value of a freshly constructed fla layer, i.e. fla's own init, also for sharded DTensors.
        """
        fresh = None
        for name, module in self.layer.named_modules():
            if isinstance(module, nn.Linear):
                std = init_std if name.split(".")[-1] in OUTPUT_PROJECTIONS else 0.02
                trunc_normal_(module.weight, mean=0.0, std=std)
                if module.bias is not None:
                    module.bias.zero_()
        linear = {f"{n}.{p}" for n, m in self.layer.named_modules() if isinstance(m, nn.Linear)
                  for p in ("weight", "bias")}
        for name, param in self.layer.named_parameters():
            if name in linear:
                continue
            if fresh is None:
                fresh = dict(self._fresh_layer().named_parameters())
            _copy_full(param, fresh[name])

    def _fresh_layer(self) -> nn.Module:
        with torch.device("cpu"):
            return getattr(require_fla(self.mixer), FLA_MIXERS[self.mixer])(**self.kwargs)


def _copy_full(param: torch.Tensor, full: torch.Tensor) -> None:
    """Copy the full tensor ``full`` into ``param``, which may be a sharded DTensor."""
    from torch.distributed.tensor import DTensor, distribute_tensor

    if isinstance(param, DTensor):
        full = distribute_tensor(full.to(param.device, param.dtype), param.device_mesh, param.placements)
        param.to_local().copy_(full.to_local())
    else:
        param.copy_(full.to(param.device, param.dtype))


def build_mixer(layer_id: int, args) -> FlaMixer:
    """The fla mixer ``args.mixer`` for block ``layer_id`` of a model with arguments ``args``."""
    settings = fla_settings(args.mixer, args.dim, args.head_dim, args.n_heads, args.n_kv_heads)
    return FlaMixer(args.mixer, args.dim, settings, layer_id, args.norm_eps)


# --- The Parallax family (SPEC sections 1 and 1b; kernels.family) ------------------------------------

# The ridge lambda of exact LLA and Affine MesaNet, one per query head: softplus(lambda_params) +
# LAMBDA_FLOOR, starting at LAMBDA_INIT (fla's MesaNet bounds its lambda the same way: floor 0.25,
# initial value 1). The floor keeps Sigma_KK + lambda I positive definite for the Cholesky solve.
LAMBDA_FLOOR = 0.25
LAMBDA_INIT = 1.0


def ridge_lambda(params: torch.Tensor) -> torch.Tensor:
    """(Hq,) ridge lambdas softplus(params) + LAMBDA_FLOOR from the (Hq,) raw parameters, in fp32 or
    wider (bf16 parameters are widened: lambda sets the conditioning of the solve)."""
    return F.softplus(params.to(torch.promote_types(params.dtype, torch.float32))) + LAMBDA_FLOOR


class FamilyMixer(nn.Module):
    """A family mixer: input projections named as the attention's (``wq``, ``wk``, ``wv``, ``wr``; the
    default optimizer routing sends them, and ``wo``, where it sends attention's), a mixing step on
    heads of ``head_dim``, and the output projection ``wo`` (Hq * D -> dim).

    Subclasses list their input projections in ``INPUTS`` and implement ``mix``. Block-causal masks
    (packed documents) are not supported: config validation refuses them, and ``forward`` raises.

    forward(x (batch, seq, dim), rope_cache, attention_masks=None, positions=None) -> (batch, seq,
    dim) in x's dtype.
    """

    INPUTS: tuple[str, ...] = ()
    name = ""

    def __init__(self, args):
        super().__init__()
        self.n_heads, self.n_kv_heads, self.head_dim = args.n_heads, args.n_kv_heads, args.head_dim
        rows = {"wq": args.n_heads, "wr": args.n_heads, "wk": args.n_kv_heads, "wv": args.n_kv_heads}
        for proj in self.INPUTS:
            setattr(self, proj, nn.Linear(args.dim, rows[proj] * args.head_dim, bias=False))
        self.wo = nn.Linear(args.n_heads * args.head_dim, args.dim, bias=False)

    def heads(self, proj: str, x: torch.Tensor) -> torch.Tensor:
        """Projection ``proj`` of x (batch, seq, dim) as (batch, seq, heads, head_dim)."""
        return getattr(self, proj)(x).unflatten(-1, (-1, self.head_dim))

    def mix(self, x: torch.Tensor, rope_cache: torch.Tensor, positions: torch.Tensor | None) -> torch.Tensor:
        """x (batch, seq, dim) -> (batch, seq, Hq, head_dim) before the output projection."""
        raise NotImplementedError

    def forward(self, x, rope_cache=None, attention_masks=None, positions=None):
        if attention_masks is not None:
            raise ValueError(f"parallax.attn_mask_type = 'block_causal' is not supported by mixer {self.name!r} "
                             "(the family kernels take no document boundaries); use 'causal'")
        return self.wo(self.mix(x, rope_cache, positions).flatten(-2))

    @torch.no_grad()
    def init_weights(self, init_std: float) -> None:
        """Input projections truncated N(0, 0.02), ``wo`` truncated N(0, init_std) (TorchTitan's
        depth-scaled std, as the attention's), norms to 1, ridge lambdas to LAMBDA_INIT."""
        for proj in self.INPUTS:
            trunc_normal_(getattr(self, proj).weight, mean=0.0, std=0.02)
        trunc_normal_(self.wo.weight, mean=0.0, std=init_std)
        for module in self.children():
            if isinstance(module, nn.RMSNorm):
                module.reset_parameters()
        params = getattr(self, "lambda_params", None)
        if params is not None:  # the inverse of softplus at LAMBDA_INIT - LAMBDA_FLOOR
            params.fill_(math.log(math.expm1(LAMBDA_INIT - LAMBDA_FLOOR)))


class ExactLLA(FamilyMixer):
    """Exact local-linear attention (SPEC 1, the parent of Parallax), ``kernels.exact_lla``:

        o_i = vbar_i + Sigma_KV(i) (Sigma_KK(i) + lambda_h I)^-1 (q_i - kbar_i)

    with softmax weights p_ij = softmax_j(q_i . k_j / sqrt(D)). q, k, v as Qwen3's attention (q/k
    RMSNorm, RoPE on q and k, GQA), lambda_h = softplus(lambda_params[h]) + LAMBDA_FLOOR learned per
    query head. Direct Cholesky solve per query: O(L^2 D^2 + L D^3) per head and sequence
    (``kernels.exact_lla_cost``), so it is for MAD and small models; ``args.lla_max_cost`` bounds a
    forward (None: no bound).
    """

    INPUTS = ("wq", "wk", "wv")
    name = "exact_lla"

    def __init__(self, args):
        super().__init__(args)
        self.q_norm = nn.RMSNorm(args.head_dim, eps=args.norm_eps)
        self.k_norm = nn.RMSNorm(args.head_dim, eps=args.norm_eps)
        self.lambda_params = nn.Parameter(torch.empty(args.n_heads))
        self.scaling = args.head_dim ** -0.5
        self.max_cost = args.lla_max_cost

    def mix(self, x, rope_cache, positions):
        q, k = apply_rotary_emb(self.q_norm(self.heads("wq", x)), self.k_norm(self.heads("wk", x)), rope_cache,
                                positions)
        return kernels.exact_lla(q, k, self.heads("wv", x), lam=ridge_lambda(self.lambda_params),
                                 scale=self.scaling, max_cost=self.max_cost)


class ValueAveraging(FamilyMixer):
    """Value Averaging (SPEC 1b, zero probe), ``kernels.value_averaging``: o_i = vbar_i = (1/i)
    sum_{j<=i} v_j, the Hkv value heads repeated to the Hq heads that ``wo`` reads (W_V and W_O keep
    the attention's shapes). No queries, keys or position information."""

    INPUTS = ("wv",)
    name = "value_averaging"

    def mix(self, x, rope_cache, positions):
        return kernels.value_averaging(self.heads("wv", x), q_heads=self.n_heads)


class AffineLinearAttention(FamilyMixer):
    """Affine Linear Attention (SPEC 1b, learned probe), ``kernels.affine_linear_attention``:

        o_i = vbar_i - Sigma_KV(i) rho_i,   rho_i = RMSNorm_h(W_R x_i)

    with uniform causal moments (p_ij = 1/i): Parallax attention without queries. The probe has a
    per-head RMSNorm (``r_norm``) as Parallax's, keys Qwen3's ``k_norm``; no RoPE, as SPEC 1b defines
    the family (rotated probes and keys would fit its running sums too). ``wr`` takes W_Q's place, so
    the parameters are the attention's.
    ``args.attn_backend`` picks the kernel: fused Triton on CUDA for head_dim 16-128, else the
    chunked PyTorch form.
    """

    INPUTS = ("wr", "wk", "wv")
    name = "affine_la"

    def __init__(self, args):
        super().__init__(args)
        self.r_norm = nn.RMSNorm(args.head_dim, eps=args.norm_eps)
        self.k_norm = nn.RMSNorm(args.head_dim, eps=args.norm_eps)
        self.backend = args.attn_backend

    def mix(self, x, rope_cache, positions):
        r, k = self.r_norm(self.heads("wr", x)), self.k_norm(self.heads("wk", x))
        return kernels.affine_linear_attention(r, k, self.heads("wv", x), backend=self.backend)


class AffineMesaNet(FamilyMixer):
    """Affine MesaNet (SPEC 1b, solved probe; uniform-weight exact LLA), ``kernels.affine_mesanet``:

        o_i = vbar_i + Sigma_KV(i) (Sigma_KK(i) + lambda_h I)^-1 (q_i - kbar_i)

    with uniform causal moments. q and k L2-normalised per head as fla's MesaNet, lambda_h =
    softplus(lambda_params[h]) + LAMBDA_FLOOR per query head; no RoPE, no short convolution, no
    output gate. One Cholesky factorisation per token and head: O(L D^3) per head and sequence.
    """

    INPUTS = ("wq", "wk", "wv")
    name = "affine_mesanet"

    def __init__(self, args):
        super().__init__(args)
        self.lambda_params = nn.Parameter(torch.empty(args.n_heads))

    def mix(self, x, rope_cache, positions):
        v = self.heads("wv", x)
        # CUDA autocast runs norms in fp32 while v stays in the autocast dtype; the kernel takes one dtype
        # (and solves in fp32 or wider whatever it is given)
        q, k = (F.normalize(self.heads(name, x), dim=-1).to(v.dtype) for name in ("wq", "wk"))
        return kernels.affine_mesanet(q, k, v, lam=ridge_lambda(self.lambda_params))


# [model] name -> family mixer class
FAMILY_MIXERS = {cls.name: cls for cls in (ExactLLA, ValueAveraging, AffineLinearAttention, AffineMesaNet)}
