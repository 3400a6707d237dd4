"""Fused Parallax decode in Triton: split-KV (flash-decoding) with a log-sum-exp merge.

One program handles one KV chunk of one (batch, kv head) and ALL query heads of
that GQA group, so the group's heads share every K/V load. The group's Q rows
and R rows sit in one tile of BM = 2 * HP rows (HP = G padded to a power of two,
at least 8, so BM >= 16 as tl.dot needs): rows [0, G) hold q (pre-scaled
after the dot), rows [HP, HP + G) hold r. One ``tl.dot`` gives s1 and t for
every head; one more ``tl.dot`` of the stacked [p; p * t] rows with V gives O1
and O2. All four accumulators (d1, O1, d2, O2) share the running-max rescale.

Programs write partials (m, d1, d2, O1, O2) per split; a merge kernel, one program
per query head and slice of its dims, combines them with a log-sum-exp reduction and writes
o = (1 + d2/d1) O1/d1 - O2/d1. ``fused_merge=True`` merges in the split kernel
instead: the last program of a group to finish (atomic ticket) merges, one launch
per step; the separate kernel was faster at every shape timed under CUDA-graph
replay (docs/bench/decode_tuning.md). With one split the program writes o directly.

On Hopper and newer a plan that splits launches both kernels with programmatic dependent launch
(``pdl``): a kernel may be scheduled while the kernel before it in the stream is still finishing,
waits (``gdc_wait``) for that grid's completion and memory before its first global read or write,
then lets its own dependent launch. A split decode step is two short launches, so the gap between
them is a visible share of its time; one-split plans (large batches) launch plainly, where PDL
measured no gain and, released early, a loss (docs/bench/attention_decode_pdl.md).

Scores are carried in base 2 (scale * log2(e) folded into the q rows' scale).
"""

from __future__ import annotations

import os

import torch
import triton
import triton.language as tl
from triton.compiler import CompiledKernel
from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait

from kernels import launcher
from kernels.parallax import tuning

LOG2E = 1.4426950408889634
_DTYPES = (torch.bfloat16, torch.float16, torch.float32)
_H200_SMS = 132
# The merge holds all splits of one head in a [SP, D] register tile.
MAX_SPLITS = 64
_SMEM_PER_SM = 228 * 1024  # H200 (and H100); read off the device when it says


@triton.jit
def _rows_to_halves(x, HP: tl.constexpr, N: tl.constexpr):
    """[2*HP, N] -> (rows [0, HP), rows [HP, 2*HP)), each [HP, N]."""
    x3 = tl.permute(tl.reshape(x, (2, HP, N)), (1, 2, 0))
    return tl.split(x3)


@triton.jit
def _halves_to_rows(a, b, HP: tl.constexpr, N: tl.constexpr):
    """(a, b) each [HP, N] -> [2*HP, N] with a on top: inverse of _rows_to_halves."""
    return tl.reshape(tl.permute(tl.join(a, b), (2, 0, 1)), (2 * HP, N))


@triton.jit
def _vec_to_rows(a, HP: tl.constexpr):
    """[HP] -> [2*HP]: the same per-head value for the q row and the r row."""
    return tl.reshape(tl.permute(tl.join(a, a), (1, 0)), (2 * HP,))


@triton.jit
def _head_offsets(heads, WIDE: tl.constexpr):
    """Head indices as the offsets into q, r and o take them: 64-bit in the WIDE variant (some
    tensor's heads reach 2^31 elements)."""
    if WIDE:
        return heads.to(tl.int64)
    else:
        return heads


@triton.jit
def _finish_store(d1, d2, acc, O, b64, hkv, stride_ob, stride_oh,
                  G: tl.constexpr, HP: tl.constexpr, D: tl.constexpr, WIDE: tl.constexpr):
    """o = (1 + d2/d1) O1/d1 - O2/d1 for the group's G heads; acc rows = [O1; O2]."""
    o1, o2 = _rows_to_halves(acc, HP, D)
    inv = tl.where(d1 > 0.0, 1.0 / d1, 0.0)
    out = ((1.0 + d2 * inv) * inv)[:, None] * o1 - inv[:, None] * o2
    hp = tl.arange(0, HP)
    offs_d = tl.arange(0, D)
    heads = _head_offsets(hkv * G + hp, WIDE)
    ptrs = O + b64 * stride_ob + heads[:, None] * stride_oh + offs_d[None, :]
    tl.store(ptrs, out.to(O.dtype.element_ty), mask=(hp < G)[:, None])


@triton.jit
def _merge_head(PO, PM, PD1, PD2, O, gid, g, d0, b64, hkv, num_splits, stride_ob, stride_oh,
                G: tl.constexpr, D: tl.constexpr, DM: tl.constexpr, SP: tl.constexpr, WIDE: tl.constexpr):
    """Log-sum-exp merge of the num_splits (<= SP) partials of head g of group gid, dims [d0, d0 + DM),
    then o = (1 + d2/d1) O1/d1 - O2/d1 for them.

    Every load is a whole tile and none depends on another, so they are all in flight at once: one
    memory round trip, then the reductions. Loads use .cg (through L2): never a stale L1 line from
    an earlier launch.
    """
    sp = tl.arange(0, SP)
    offs_d = d0 + tl.arange(0, DM)
    smask = sp < num_splits
    gbase = gid.to(tl.int64) * G
    stat = (gbase + g) * num_splits + sp
    row1 = ((gbase * 2 + g) * num_splits + sp)[:, None] * D + offs_d[None, :]
    row2 = ((gbase * 2 + G + g) * num_splits + sp)[:, None] * D + offs_d[None, :]
    ms = tl.load(PM + stat, mask=smask, other=float("-inf"), cache_modifier=".cg")
    pd1 = tl.load(PD1 + stat, mask=smask, other=0.0, cache_modifier=".cg")
    pd2 = tl.load(PD2 + stat, mask=smask, other=0.0, cache_modifier=".cg")
    po1 = tl.load(PO + row1, mask=smask[:, None], other=0.0, cache_modifier=".cg")
    po2 = tl.load(PO + row2, mask=smask[:, None], other=0.0, cache_modifier=".cg")
    m = tl.max(ms, 0)
    w = tl.exp2(ms - tl.where(m == float("-inf"), 0.0, m))  # 0 for empty and padded splits
    d1 = tl.sum(w * pd1, 0)
    d2 = tl.sum(w * pd2, 0)
    inv = tl.where(d1 > 0.0, 1.0 / d1, 0.0)
    out = (1.0 + d2 * inv) * inv * tl.sum(w[:, None] * po1, 0) - inv * tl.sum(w[:, None] * po2, 0)
    tl.store(O + b64 * stride_ob + _head_offsets(hkv * G + g, WIDE) * stride_oh + offs_d, out.to(O.dtype.element_ty))


@triton.jit
def _decode_split_kernel(
    Q, R, K, V, O, SEQLENS, PO, PM, PD1, PD2, COUNTER,
    scale_log2,
    stride_qb, stride_qh, stride_rb, stride_rh,
    stride_kb, stride_kl, stride_kh, stride_vb, stride_vl, stride_vh,
    stride_ob, stride_oh,
    L, WINDOW, chunk, num_splits,
    HKV: tl.constexpr, G: tl.constexpr, HP: tl.constexpr, D: tl.constexpr, BN: tl.constexpr,
    HAS_SEQLENS: tl.constexpr, SPLIT: tl.constexpr, FUSED_MERGE: tl.constexpr, IEEE: tl.constexpr,
    SP: tl.constexpr, PDL: tl.constexpr = False, WIDE: tl.constexpr = False,
):
    if PDL:
        gdc_wait()
        gdc_launch_dependents()
    gid = tl.program_id(0)  # batch x kv heads on the first grid dim: CUDA's second stops at 65535
    sid = tl.program_id(1)
    b = gid // HKV
    hkv = gid % HKV
    b64 = b.to(tl.int64)
    seqlen = L
    if HAS_SEQLENS:
        # unchecked values (DecodePlan) must not read outside the cache: clamp to [0, L]
        seqlen = tl.minimum(tl.maximum(tl.load(SEQLENS + b), 0), L)
    # the valid positions are [seqlen - WINDOW, seqlen) (all of [0, seqlen) while seqlen <= WINDOW)
    start = tl.maximum(seqlen - WINDOW, 0) + sid * chunk
    end = tl.minimum(start + chunk, seqlen)

    BM: tl.constexpr = 2 * HP
    rows = tl.arange(0, BM)
    is_q = rows < HP
    row_ok = (rows % HP) < G
    head = _head_offsets(hkv * G + rows % HP, WIDE)
    offs_d = tl.arange(0, D)
    q_rows = tl.load(Q + b64 * stride_qb + head[:, None] * stride_qh + offs_d[None, :],
                     mask=(row_ok & is_q)[:, None], other=0.0)
    r_rows = tl.load(R + b64 * stride_rb + head[:, None] * stride_rh + offs_d[None, :],
                     mask=(row_ok & ~is_q)[:, None], other=0.0)
    qr = q_rows + r_rows
    row_scale = tl.where(is_q, scale_log2, 1.0)

    offs_n = tl.arange(0, BN)
    pos = start + offs_n
    kv_head = hkv
    k_step = BN * stride_kl
    v_step = BN * stride_vl
    if WIDE:  # some tensor's positions or heads reach 2^31 elements: 64-bit offsets
        pos = pos.to(tl.int64)
        kv_head = kv_head.to(tl.int64)
        k_step = tl.cast(stride_kl, tl.int64) * BN
        v_step = tl.cast(stride_vl, tl.int64) * BN
    k_ptrs = K + b64 * stride_kb + kv_head * stride_kh + pos[:, None] * stride_kl + offs_d[None, :]
    v_ptrs = V + b64 * stride_vb + kv_head * stride_vh + pos[:, None] * stride_vl + offs_d[None, :]
    m = tl.full([HP], float("-inf"), tl.float32)
    d1 = tl.zeros([HP], tl.float32)
    d2 = tl.zeros([HP], tl.float32)
    acc = tl.zeros([BM, D], tl.float32)
    for n0 in range(start, end, BN):
        valid = (n0 + offs_n) < end
        # Masked loads: positions past seqlen may hold garbage (even NaN).
        kt = tl.load(k_ptrs, mask=valid[:, None], other=0.0)
        vt = tl.load(v_ptrs, mask=valid[:, None], other=0.0)
        if IEEE:
            s = tl.dot(qr, tl.trans(kt), input_precision="ieee")
        else:
            s = tl.dot(qr, tl.trans(kt))
        s1, t = _rows_to_halves(s * row_scale[:, None], HP, BN)
        s1 = tl.where(valid[None, :], s1, float("-inf"))
        m_new = tl.maximum(m, tl.max(s1, 1))
        alpha = tl.exp2(m - m_new)
        p = tl.exp2(s1 - m_new[:, None])
        pt = p * t
        d1 = d1 * alpha + tl.sum(p, 1)
        d2 = d2 * alpha + tl.sum(pt, 1)
        pp = _halves_to_rows(p, pt, HP, BN).to(vt.dtype)
        if IEEE:
            pv = tl.dot(pp, vt, input_precision="ieee")
        else:
            pv = tl.dot(pp, vt)
        acc = acc * _vec_to_rows(alpha, HP)[:, None] + pv
        m = m_new
        k_ptrs += k_step
        v_ptrs += v_step

    if SPLIT:
        # Split index innermost, so the merge reads each head's splits as one tile.
        gbase = gid.to(tl.int64) * G
        hp = tl.arange(0, HP)
        stat = (gbase + hp) * num_splits + sid
        tl.store(PM + stat, m, mask=hp < G)
        tl.store(PD1 + stat, d1, mask=hp < G)
        tl.store(PD2 + stat, d2, mask=hp < G)
        prow = ((gbase * 2 + (rows // HP) * G + rows % HP) * num_splits + sid)
        tl.store(PO + prow[:, None] * D + offs_d[None, :], acc, mask=row_ok[:, None])
        if FUSED_MERGE:
            # Every thread's partial stores must precede the (release) ticket.
            tl.debug_barrier()
            ticket = tl.atomic_add(COUNTER + gid, 1, sem="acq_rel")
            if ticket == num_splits - 1:
                for g in tl.static_range(G):
                    _merge_head(PO, PM, PD1, PD2, O, gid, g, 0, b64, hkv, num_splits, stride_ob, stride_oh,
                                G, D, D, SP, WIDE)
                # Re-arm the ticket for the next launch (stream order publishes it).
                tl.store(COUNTER + gid, 0)
    else:
        _finish_store(d1, d2, acc, O, b64, hkv, stride_ob, stride_oh, G, HP, D, WIDE)


@triton.jit
def _merge_kernel(PO, PM, PD1, PD2, O, num_splits, stride_ob, stride_oh,
                  HKV: tl.constexpr, G: tl.constexpr, D: tl.constexpr, DM: tl.constexpr, SP: tl.constexpr,
                  PDL: tl.constexpr = False, WIDE: tl.constexpr = False):
    """One program per (query head, DM of its D dims): many short programs, not one per group."""
    if PDL:
        gdc_wait()
        gdc_launch_dependents()
    head = tl.program_id(0)
    gid = head // G
    b64 = (gid // HKV).to(tl.int64)
    _merge_head(PO, PM, PD1, PD2, O, gid, head % G, tl.program_id(1) * DM, b64, gid % HKV, num_splits,
                stride_ob, stride_oh, G, D, DM, SP, WIDE)


def pdl_supported(device) -> bool:
    """Whether ``device`` can launch with programmatic dependent launch: CUDA devices of compute
    capability 9.0 (Hopper) or newer, outside the interpreter."""
    device = torch.device(device)
    if device.type != "cuda" or os.environ.get("TRITON_INTERPRET") == "1":
        return False
    return torch.cuda.get_device_capability(device)[0] >= 9


def _check_pdl(pdl, device, split: bool) -> bool:
    """``pdl`` as a plan uses it: None -> on where supported and the plan ``split``s; True only where
    the hardware has it."""
    if pdl is None:
        return split and pdl_supported(device)
    if not isinstance(pdl, bool):
        raise TypeError(f"pdl must be None, True or False, got {pdl!r}")
    if pdl and not pdl_supported(device):
        raise ValueError(f"pdl=True needs a CUDA device of compute capability 9.0 or newer (outside "
                         f"TRITON_INTERPRET), got device {torch.device(device)}")
    return pdl


def pick_merge_block_d(dim: int, requested=None) -> int:
    """Head dims per program of the separate merge kernel at head dim ``dim``: ``requested`` (an int
    >= 1 dividing ``dim``, else ValueError) or ``tuning.DECODE_MERGE_BLOCK_D`` capped at ``dim``."""
    block = min(dim, tuning.DECODE_MERGE_BLOCK_D) if requested is None else requested
    if isinstance(block, bool) or not isinstance(block, int) or block < 1 or dim % block:
        raise ValueError(f"merge_block_d must be an int >= 1 that divides the head dim {dim}, got {requested!r}")
    return block


def supports(dtype, dim):
    """Whether the Triton kernel handles this dtype (of q, r and the caches) and head dim (a power
    of 2 in [16, 256])."""
    return dtype in _DTYPES and 16 <= dim <= 256 and dim & (dim - 1) == 0


def pick_num_splits(n_groups, length, block_n, slots):
    """Splits per (batch, kv head): among the counts whose programs all fit in one wave
    (n_groups * splits <= ``slots``, the programs resident at once = SMs * programs per SM), the one
    whose longest split walks the fewest blocks of block_n positions; the fewest splits among equals,
    at least tuning.DECODE_MIN_CHUNK positions per split, and one split once the groups alone fill a wave.

    Splitting into several waves lost wherever it was timed (B = 32, L = 16384: 2 splits 610 us
    against 470 for 1; the partial writes and the merge cost more than the finer waves gain). At
    batch 1 the rule takes equal chunks (32 splits of 512 positions at L = 16384 on an H200) where
    a wave-efficiency rule took a ragged 29 (24.2 vs 24.9 us, D = 128; docs/kernels_decode.md)."""
    shortest = max(tuning.DECODE_MIN_CHUNK, block_n)
    most = max(1, min(MAX_SPLITS, slots // max(n_groups, 1), triton.cdiv(length, shortest)))
    blocks = lambda splits: triton.cdiv(triton.cdiv(length, splits), block_n)  # noqa: E731
    return min(range(1, most + 1), key=lambda splits: (blocks(splits), splits))


def split_chunk(span, num_splits, block_n):
    """(chunk, splits) of ``span`` positions asked to split ``num_splits`` ways: positions per split,
    a multiple of block_n, and the split count those chunks make, which can be below the one asked
    for (48 -> 32 at span 4096, block_n 64)."""
    chunk = triton.cdiv(triton.cdiv(span, num_splits), block_n) * block_n
    return chunk, triton.cdiv(span, chunk)


def launch_grids(n_groups, num_splits, group, dim, merge_block_d):
    """(the split kernel's grid, the merge kernel's grid) for ``n_groups`` (batch x kv heads) groups of
    ``group`` query heads: a program per (group, split) and per (query head, ``merge_block_d`` of its
    ``dim`` dims), the groups and heads on the first grid dim (CUDA's second and third stop at 65535,
    which batch x kv heads can pass; at most 64 splits and ``dim`` blocks cannot)."""
    return (n_groups, num_splits), (n_groups * group, dim // merge_block_d)


def wide_variants(positions, kv_heads, q_heads, strides) -> tuple[bool, bool]:
    """WIDE of the split and of the merge kernel for a call with ``strides`` (q's and r's batch and
    head, k's and v's batch, position and head, out's batch and head), where the split kernel's
    offsets span ``positions`` cache positions and ``kv_heads`` / ``q_heads`` heads: 64-bit offsets
    where a cache's position plus head offset, or a head offset of q, r or out, reaches 2^31
    elements (the batch offsets are 64-bit in both variants)."""
    _, sq_h, _, sr_h, _, sk_l, sk_h, _, sv_l, sv_h, _, so_h = strides
    out = q_heads * so_h
    caches = (positions * sk_l + kv_heads * sk_h, positions * sv_l + kv_heads * sv_h)
    return launcher.wide_offsets(*caches, q_heads * sq_h, q_heads * sr_h, out), launcher.wide_offsets(out)


def pick_config(n_groups: int, dim: int, device) -> tuple[int, int, int]:
    """(block_n, num_warps, num_stages) for ``n_groups`` (batch x kv heads) groups of head dim ``dim``:
    the many-groups configs once the groups alone fill more than two waves of one program per SM."""
    many = n_groups > 2 * _sm_count(device)
    table = tuning.DECODE_MANY_GROUPS_CONFIGS if many else tuning.DECODE_CONFIGS
    return table.get(dim, tuning.DECODE_DEFAULT_CONFIG)


def _sm_count(device) -> int:
    """Multiprocessors of a CUDA device (the H200's count elsewhere, e.g. under the interpreter)."""
    return torch.cuda.get_device_properties(device).multi_processor_count if device.type == "cuda" else _H200_SMS


def resident_slots(device, block_n, dim, num_stages, elt_bytes):
    """SMs * programs per SM, the latter bounded by the K/V pipeline's shared memory."""
    smem = _SMEM_PER_SM
    if device.type == "cuda":
        smem = getattr(torch.cuda.get_device_properties(device), "shared_memory_per_multiprocessor", smem)
    per_program = num_stages * 2 * block_n * dim * elt_bytes
    return _sm_count(device) * max(1, smem // per_program)


class TritonDecodePlan:
    """The split-KV kernel's launch for one geometry, worked out once: launch configuration, split
    count, scratch for the partials (and, with ``fused_merge``, the merge tickets: its own, zeroed
    here and re-armed by the merging programs), so a call launches the split kernel and, with
    several splits, the merge kernel, and allocates only its output.

    batch, hq, hkv, dim, length (cache slots L), dtype (of q, r and the caches), device; scale a
    float; window None or an int >= 1 (each sequence reads its last ``window`` valid positions,
    the splits cover min(L, window) positions). ``pdl``: programmatic dependent launch; None (the
    default) turns it on where ``pdl_supported(device)`` and the plan splits. ``merge_block_d``: head
    dims per program of the separate merge (``pick_merge_block_d``). The other keywords override the
    tuned launch configuration (tests, sweeps). One call at a time: the scratch is shared by its calls,
    so calls on several streams at once would race (calls on one stream, or graph replays, are safe).
    """

    def __init__(self, batch, hq, hkv, dim, length, dtype, device, *, scale, window=None, num_splits=None,
                 block_n=None, num_warps=None, num_stages=None, fused_merge=False, pdl=None, merge_block_d=None):
        self.device = device = torch.device(device)
        if not supports(dtype, dim):
            raise TypeError(f"triton decode needs a dtype in {_DTYPES} and a power-of-2 head dim in [16, 256]; "
                            f"got {dtype}, D={dim}")
        if device.type != "cuda" and os.environ.get("TRITON_INTERPRET") != "1":
            raise RuntimeError(f"triton decode needs CUDA tensors (or TRITON_INTERPRET=1), got device {device}")
        group, n_groups = hq // hkv, batch * hkv
        cfg = pick_config(n_groups, dim, device)
        block_n, num_warps, num_stages = block_n or cfg[0], num_warps or cfg[1], num_stages or cfg[2]
        span = min(length, window or length)  # positions one sequence reads, at most
        if num_splits is None:
            slots = resident_slots(device, block_n, dim, num_stages, dtype.itemsize)
            num_splits = pick_num_splits(n_groups, span, block_n, slots)
        chunk, self.num_splits = split_chunk(span, num_splits, block_n)
        if self.num_splits > MAX_SPLITS:
            raise ValueError(f"num_splits must be at most {MAX_SPLITS}, got {self.num_splits}")
        self.split = self.num_splits > 1
        self.fused_merge = fused_merge
        self.pdl = _check_pdl(pdl, device, self.split)
        self.launch_config = (block_n, num_warps, num_stages)
        scratch = n_groups * self.num_splits * group if self.split else 1
        self._part_o = torch.empty((scratch * 2, dim) if self.split else (1,), dtype=torch.float32, device=device)
        self._part_s = [torch.empty(scratch, dtype=torch.float32, device=device) for _ in range(3)]
        tickets = self.split and fused_merge
        self._counter = torch.zeros(n_groups, dtype=torch.int32, device=device) if tickets else self._part_s[0]
        self._scale_log2 = scale * LOG2E
        self._sizes = (length, span, chunk, self.num_splits)
        self._reach = (length + block_n, hkv, hq)  # the positions (masked tail included) and heads offsets span
        hp, sp = max(8, triton.next_power_of_2(group)), max(16, triton.next_power_of_2(self.num_splits))
        self.merge_block_d = pick_merge_block_d(dim, merge_block_d)
        launch = dict(PDL=True, launch_pdl=True) if self.pdl else dict(PDL=False)
        self._grid, self._merge_grid = launch_grids(n_groups, self.num_splits, group, dim, self.merge_block_d)
        self._merge_meta = dict(HKV=hkv, G=group, D=dim, DM=self.merge_block_d, SP=sp, num_warps=4, **launch)
        self._meta = dict(BN=block_n, SPLIT=self.split, FUSED_MERGE=fused_merge, IEEE=dtype == torch.float32,
                          num_warps=num_warps, num_stages=num_stages, HKV=hkv, G=group, HP=hp, D=dim, SP=sp,
                          **launch)
        self._runners = {}  # (seqlens given, strides, pointer alignments) -> launcher of the compiled kernel

    def __call__(self, q, r, k_cache, v_cache, cache_seqlens=None, out=None):
        """o (batch, 1, Hq, D) in q's dtype, written into ``out`` when given. Tensors as the plan's
        geometry (not checked here), any strides; cache_seqlens int32 (batch,) or None (all L), values
        in [1, L] (not checked; the kernel clamps them to [0, L], so it never reads outside the cache).
        Tensors whose position or head offsets reach 2^31 elements (a long cache, or a strided view of
        a wide buffer) take the kernels' 64-bit offset variant (``wide_variants``)."""
        tensors = [q, r, k_cache, v_cache]
        if any(x.stride(-1) != 1 for x in tensors):
            tensors = [x.contiguous() for x in tensors]
        q, r, k_cache, v_cache = tensors
        if cache_seqlens is not None and cache_seqlens.stride(0) != 1:
            cache_seqlens = cache_seqlens.contiguous()  # the kernel reads length b at SEQLENS + b
        out = torch.empty_like(q) if out is None else out
        tensors += [out, self._part_s[0] if cache_seqlens is None else cache_seqlens]
        sq, sr, sk, sv, so = (x.stride() for x in tensors[:5])
        strides = (sq[0], sq[2], sr[0], sr[2], sk[0], sk[1], sk[2], sv[0], sv[1], sv[2], so[0], so[2])
        args = (*tensors, self._part_o, *self._part_s, self._counter, self._scale_log2, *strides, *self._sizes)
        # the strides are part of the launch keys, so WIDE needs no key of its own
        wide, merge_wide = wide_variants(*self._reach, strides)
        meta = {**self._meta, "HAS_SEQLENS": cache_seqlens is not None, "WIDE": wide}
        with launcher.on_device(self.device):
            self._launch(_decode_split_kernel, self._grid, args, meta, (meta["HAS_SEQLENS"], strides, tensors))
            if self.split and not self.fused_merge:
                args = (self._part_o, *self._part_s, out, self.num_splits, so[0], so[2])
                self._launch(_merge_kernel, self._merge_grid, args, {**self._merge_meta, "WIDE": merge_wide},
                             (None, (so[0], so[2]), [out]))
        return out

    def _launch(self, kernel, grid, args, meta, key):
        """Launch JIT ``kernel`` on ``grid`` with runtime ``args`` and launch ``meta`` (constexprs,
        num_warps, num_stages). Triton's launch path re-derives the compiled variant from every
        argument on every call (most of a decode step's host time); the variant depends only on
        ``meta``, the integer arguments' values (fixed by the plan but for the strides) and whether
        each pointer is 16-byte aligned, so the plan keeps the compiled kernel per ``key`` (extra
        flags, strides, the tensors whose alignment counts) and launches it directly. Under the
        interpreter every call takes triton's path."""
        flags, strides, tensors = key
        key = (kernel, flags, strides, tuple(x.data_ptr() % 16 == 0 for x in tensors))
        runner = self._runners.get(key)
        if runner is not None:
            runner(*args)
            return
        compiled = kernel[grid](*args, **meta)
        if isinstance(compiled, CompiledKernel):
            if len(self._runners) >= 8:  # strides or alignments that keep changing: keep a few
                self._runners.clear()
            # a direct launch takes every argument in signature order, the constexprs included
            constexprs = tuple(meta[p.name] for p in kernel.params if p.is_constexpr)
            launch = compiled[(*grid, 1, 1)[:3]]  # a direct launch reads all three grid dimensions
            self._runners[key] = lambda *runtime: launch(*runtime, *constexprs)


def parallax_decode_triton(q, r, k_cache, v_cache, cache_seqlens, scale, *, window=None, **launch):
    """One decode with a plan built for this call (tests and sweeps; ``kernels.DecodePlan`` keeps
    its plan). Inputs as ``kernels.parallax.decode.parallax_decode`` (already validated),
    ``cache_seqlens`` int32 (batch,) or None, ``scale`` a float; ``launch``: TritonDecodePlan's
    keywords num_splits, block_n, num_warps, num_stages, fused_merge, pdl. Returns (batch, 1, Hq, D).
    """
    if not supports(q.dtype, q.shape[-1]) or not q.dtype == r.dtype == k_cache.dtype == v_cache.dtype:
        raise TypeError(
            f"triton decode needs q, r, k_cache, v_cache all of one dtype in {_DTYPES} and a power-of-2 "
            f"head dim in [16, 256]; got q {q.dtype}, r {r.dtype}, k_cache {k_cache.dtype}, D={q.shape[-1]}"
        )
    batch, _, hq, dim = q.shape
    plan = TritonDecodePlan(batch, hq, k_cache.shape[2], dim, k_cache.shape[1], q.dtype, q.device, scale=scale,
                            window=window, **launch)
    return plan(q, r, k_cache, v_cache, cache_seqlens)
