"""Triton tree attention for speculative verification.

Every tree node attends to the whole cached prefix plus its ancestors and itself. The prefix is read in
BLOCK_N tiles that load no mask (only the chunk end bounds them); only the final T keys, the tree, consult
the packed ancestor bits. One program holds all GQA query heads of one kv head, so each KV tile is read
once for the whole group; long prefixes are cut into chunks run by separate programs and merged by
log-sum-exp (flash-decoding), because batch x kv heads alone cannot fill a GPU.
"""

import math

import torch
import triton
import triton.language as tl
from triton.runtime.interpreter import InterpretedFunction

from .tree_mask import WORD_BITS, TreeMaskBits, pack_tree_mask

SUPPORTED_DTYPES = (torch.float32, torch.float16, torch.bfloat16)
MIN_SPLIT_KEYS = 1024  # below this, the fp32 partials of a chunk cost more traffic than its parallelism hides
COMBINE_BLOCK_T = 16


@triton.jit
def _dot(a, b, DOT_FP32: tl.constexpr):
    # Triton 3.9's interpreter multiplies bf16 operands as their raw uint16 bits; only there, go via fp32.
    if DOT_FP32:
        a = a.to(tl.float32)
        b = b.to(tl.float32)
    return tl.dot(a, b, input_precision="ieee")


@triton.jit
def _online_softmax_step(
    acc,  # acc: [BLOCK_M, BLOCK_D] fp32, unnormalised output
    m_i,  # m_i: [BLOCK_M] fp32, running max in log2 units
    l_i,  # l_i: [BLOCK_M] fp32, running sum of exp2
    q,  # q: [BLOCK_M, BLOCK_D]
    kt,  # kt: [BLOCK_D, BLOCK_N], keys transposed
    v,  # v: [BLOCK_N, BLOCK_D]
    allowed,  # allowed: [BLOCK_M, BLOCK_N] or [1, BLOCK_N] bool
    qk_scale,  # softmax scale times log2(e)
    DOT_FP32: tl.constexpr,
):
    qk = _dot(q, kt, DOT_FP32) * qk_scale
    qk = tl.where(allowed, qk, float("-inf"))
    m_new = tl.maximum(m_i, tl.max(qk, 1))
    # A row may see nothing in a tree tile (its nodes lie in a later tile): keep exp2 finite.
    m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
    alpha = tl.math.exp2(m_i - m_safe)
    p = tl.math.exp2(qk - m_safe[:, None])
    l_i = l_i * alpha + tl.sum(p, 1)
    acc = acc * alpha[:, None] + _dot(p.to(v.dtype), v, DOT_FP32)
    return acc, m_new, l_i


@triton.jit
def _tree_attention_kernel(
    q_ptr,  # q: [B, Hq, T, D]
    k_ptr,  # k: [B, Hkv, S, D]
    v_ptr,  # v: [B, Hkv, S, D]
    bits_ptr,  # bits: [B, T, W] int32, bit j % 32 of word j // 32 in row i: node i sees node j
    out_ptr,  # out: [B, Hq, T, D], written when SPLIT is off
    part_o_ptr,  # part_o: [NSPLIT, B * Hq, T, D] fp32 contiguous, normalised per chunk, when SPLIT
    part_lse_ptr,  # part_lse: [NSPLIT, B * Hq, T] fp32 contiguous, log2-sum-exp2 per chunk, when SPLIT
    stride_qb, stride_qh, stride_qt, stride_qd,
    stride_kb, stride_kh, stride_ks, stride_kd,
    stride_vb, stride_vh, stride_vs, stride_vd,
    stride_bb, stride_bt, stride_bw,
    stride_ob, stride_oh, stride_ot, stride_od,
    T, S, D, chunk,  # chunk: prefix keys per split, a multiple of BLOCK_N
    qk_scale,
    HKV: tl.constexpr, G: tl.constexpr,  # G: query heads per kv head
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr, WORD_BITS: tl.constexpr,
    SPLIT: tl.constexpr, DOT_FP32: tl.constexpr,
):
    split = tl.program_id(0)
    pid_bh = tl.program_id(1)
    pid_m = tl.program_id(2)
    b = (pid_bh // HKV).to(tl.int64)
    kvh = (pid_bh % HKV).to(tl.int64)
    prefix = S - T

    rows = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)  # row = g * T + t
    row_valid = rows < G * T
    g = rows // T
    t = rows % T
    head = kvh * G + g
    offs_d = tl.arange(0, BLOCK_D)
    d_valid = offs_d < D

    q_ptrs = q_ptr + b * stride_qb + head[:, None] * stride_qh + t[:, None] * stride_qt + offs_d[None, :] * stride_qd
    q = tl.load(q_ptrs, mask=row_valid[:, None] & d_valid[None, :], other=0.0)
    k_base = k_ptr + b * stride_kb + kvh * stride_kh + offs_d[:, None] * stride_kd
    v_base = v_ptr + b * stride_vb + kvh * stride_vh + offs_d[None, :] * stride_vd

    acc = tl.zeros([BLOCK_M, BLOCK_D], dtype=tl.float32)
    m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)

    # Prefix chunk: every row sees every key, so only the chunk end bounds the tile.
    lo = split * chunk
    hi = tl.minimum(lo + chunk, prefix)
    for start in range(lo, hi, BLOCK_N):
        offs_n = start + tl.arange(0, BLOCK_N)
        key_valid = offs_n < hi
        kt = tl.load(k_base + offs_n[None, :] * stride_ks, mask=d_valid[:, None] & key_valid[None, :], other=0.0)
        v = tl.load(v_base + offs_n[:, None] * stride_vs, mask=key_valid[:, None] & d_valid[None, :], other=0.0)
        acc, m_i, l_i = _online_softmax_step(acc, m_i, l_i, q, kt, v, key_valid[None, :], qk_scale, DOT_FP32)

    # Tree: the last program along the split axis reads the T node keys, one 32-node word of bits per row
    # and tile.
    tree_end = tl.where(split == tl.num_programs(0) - 1, T, 0)
    bits_rows = bits_ptr + b * stride_bb + t * stride_bt
    for start in range(0, tree_end, WORD_BITS):
        offs_j = start + tl.arange(0, WORD_BITS)
        node_valid = offs_j < T
        offs_n = prefix + offs_j
        kt = tl.load(k_base + offs_n[None, :] * stride_ks, mask=d_valid[:, None] & node_valid[None, :], other=0.0)
        v = tl.load(v_base + offs_n[:, None] * stride_vs, mask=node_valid[:, None] & d_valid[None, :], other=0.0)
        # Padding rows read an all-ones word, so they see every node and never produce NaN.
        word = tl.load(bits_rows + (start // WORD_BITS) * stride_bw, mask=row_valid, other=-1)  # [BLOCK_M]
        allowed = (((word[:, None] >> tl.arange(0, WORD_BITS)[None, :]) & 1) != 0) & node_valid[None, :]
        acc, m_i, l_i = _online_softmax_step(acc, m_i, l_i, q, kt, v, allowed, qk_scale, DOT_FP32)

    o = acc / l_i[:, None]
    store_mask = row_valid[:, None] & d_valid[None, :]
    if SPLIT:
        part_row = (split * tl.num_programs(1) + pid_bh).to(tl.int64) * G * T + g * T + t
        tl.store(part_o_ptr + part_row[:, None] * D + offs_d[None, :], o, mask=store_mask)
        tl.store(part_lse_ptr + part_row, m_i + tl.math.log2(l_i), mask=row_valid)
    else:
        out_ptrs = out_ptr + b * stride_ob + head[:, None] * stride_oh + t[:, None] * stride_ot
        tl.store(out_ptrs + offs_d[None, :] * stride_od, o.to(out_ptr.dtype.element_ty), mask=store_mask)


@triton.jit
def _combine_splits_kernel(
    part_o_ptr,  # part_o: [NSPLIT, B * Hq, T, D] fp32 contiguous
    part_lse_ptr,  # part_lse: [NSPLIT, B * Hq, T] fp32 contiguous
    out_ptr,  # out: [B, Hq, T, D]
    stride_ob, stride_oh, stride_ot, stride_od,
    T, D, NSPLIT,
    HQ: tl.constexpr, BLOCK_T: tl.constexpr, BLOCK_D: tl.constexpr,
):
    pid_bh = tl.program_id(0)
    b = (pid_bh // HQ).to(tl.int64)
    h = (pid_bh % HQ).to(tl.int64)
    t = tl.program_id(1) * BLOCK_T + tl.arange(0, BLOCK_T)
    offs_d = tl.arange(0, BLOCK_D)
    t_valid = t < T
    tile_mask = t_valid[:, None] & (offs_d < D)[None, :]

    acc = tl.zeros([BLOCK_T, BLOCK_D], dtype=tl.float32)
    m_i = tl.full([BLOCK_T], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_T], dtype=tl.float32)
    rows_per_split = tl.num_programs(0).to(tl.int64) * T
    for s in range(NSPLIT):
        row = s * rows_per_split + pid_bh * T + t
        lse = tl.load(part_lse_ptr + row, mask=t_valid, other=0.0)
        o = tl.load(part_o_ptr + row[:, None] * D + offs_d[None, :], mask=tile_mask, other=0.0)
        m_new = tl.maximum(m_i, lse)
        alpha = tl.math.exp2(m_i - m_new)
        w = tl.math.exp2(lse - m_new)
        acc = acc * alpha[:, None] + o * w[:, None]
        l_i = l_i * alpha + w
        m_i = m_new

    out_ptrs = out_ptr + b * stride_ob + h * stride_oh + t[:, None] * stride_ot + offs_d[None, :] * stride_od
    tl.store(out_ptrs, (acc / l_i[:, None]).to(out_ptr.dtype.element_ty), mask=tile_mask)


# True when TRITON_INTERPRET=1 was set before this module was imported: the kernels then run on CPU tensors.
INTERPRETED = isinstance(_tree_attention_kernel, InterpretedFunction)


def tree_attention(
    q: torch.Tensor,  # q: [B, Hq, T, D]
    k: torch.Tensor,  # k: [B, Hkv, S, D], the last T positions are the tree nodes
    v: torch.Tensor,  # v: [B, Hkv, S, D]
    tree_mask: torch.Tensor | TreeMaskBits,  # [B, T, T] bool (node j ancestor of node i) or its packed bits
    scale: float | None = None,
    *,
    out: torch.Tensor | None = None,  # out: [B, Hq, T, D], any strides; allocated when None
    kv_splits: int | None = None,
) -> torch.Tensor:  # out: [B, Hq, T, D]
    """Attention of T tree nodes over an S-long KV (prefix plus the nodes), softmax in fp32.

    kv_splits cuts the prefix into that many chunks run in parallel and merged afterwards;
    None picks enough to fill the GPU (always 1 off CUDA), 1 runs one program per query tile.
    """
    bits = _validate(q, k, v, tree_mask, out)
    batch, q_heads, nodes, head_dim = q.shape
    kv_heads, seq = k.shape[1], k.shape[2]
    groups = q_heads // kv_heads
    prefix = seq - nodes
    scale = 1.0 / math.sqrt(head_dim) if scale is None else scale
    if out is None:
        out = torch.empty_like(q)

    block_m, block_n, num_warps = _tiles(q.dtype, groups * nodes)
    block_d = max(16, triton.next_power_of_2(head_dim))
    m_blocks = triton.cdiv(groups * nodes, block_m)
    if kv_splits is None:
        kv_splits = _auto_kv_splits(q.device, batch * kv_heads * m_blocks, prefix)
    if kv_splits < 1:
        raise ValueError(f"kv_splits must be >= 1, got {kv_splits}")
    split = kv_splits > 1 and prefix > 0
    chunk = triton.cdiv(triton.cdiv(prefix, kv_splits), block_n) * block_n if split else prefix
    num_programs_split = triton.cdiv(prefix, chunk) + 1 if split else 1

    if split:
        part_o = torch.empty(num_programs_split, batch * q_heads, nodes, head_dim, dtype=torch.float32, device=q.device)
        part_lse = torch.empty(num_programs_split, batch * q_heads, nodes, dtype=torch.float32, device=q.device)
    else:
        part_o = part_lse = out  # unused by the kernel when SPLIT is off
    launch = {} if INTERPRETED else {"num_warps": num_warps, "num_stages": 3}
    _tree_attention_kernel[(num_programs_split, batch * kv_heads, m_blocks)](
        q, k, v, bits.words, out, part_o, part_lse,
        *q.stride(), *k.stride(), *v.stride(), *bits.words.stride(), *out.stride(),
        nodes, seq, head_dim, chunk,
        scale * math.log2(math.e),
        HKV=kv_heads, G=groups,
        BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_D=block_d, WORD_BITS=WORD_BITS,
        SPLIT=split, DOT_FP32=INTERPRETED and q.dtype == torch.bfloat16,
        **launch,
    )
    if split:
        block_t = min(COMBINE_BLOCK_T, triton.next_power_of_2(nodes))
        _combine_splits_kernel[(batch * q_heads, triton.cdiv(nodes, block_t))](
            part_o, part_lse, out,
            *out.stride(),
            nodes, head_dim, num_programs_split,
            HQ=q_heads, BLOCK_T=block_t, BLOCK_D=block_d,
        )
    return out


def _tiles(dtype: torch.dtype, rows: int) -> tuple[int, int, int]:
    """(BLOCK_M, BLOCK_N, num_warps) that compile without register spills for sm_90 at D = 128 (ptxas -v).

    16-bit tiles run on wgmma; fp32 runs exact (ieee) FMA dots, which only fit in registers as small tiles.
    The interpreter has no registers but pays per program and tile, so it always takes the large tiles.
    """
    if dtype == torch.float32 and not INTERPRETED:
        return 16, 32, 8
    block_m = min(128, max(16, triton.next_power_of_2(rows)))
    return block_m, 64, 8 if block_m >= 64 else 4


def _auto_kv_splits(device: torch.device, programs: int, prefix: int) -> int:
    """Enough prefix chunks for about two programs per SM, none shorter than MIN_SPLIT_KEYS."""
    if device.type != "cuda":
        return 1
    sms = torch.cuda.get_device_properties(device).multi_processor_count
    return max(1, min(triton.cdiv(2 * sms, programs), prefix // MIN_SPLIT_KEYS))


def _validate(q, k, v, tree_mask, out) -> TreeMaskBits:
    """Check shapes, dtypes and devices up front: a bad stride or shape in a kernel is silent garbage."""
    for name, tensor in (("q", q), ("k", k), ("v", v)):
        if not isinstance(tensor, torch.Tensor) or tensor.dim() != 4:
            raise ValueError(f"{name} must be a 4-D tensor, got {getattr(tensor, 'shape', type(tensor))}")
    if q.dtype not in SUPPORTED_DTYPES:
        raise ValueError(f"q dtype must be one of {SUPPORTED_DTYPES}, got {q.dtype}")
    if k.dtype != q.dtype or v.dtype != q.dtype:
        raise ValueError(f"q, k, v must share a dtype, got {q.dtype}, {k.dtype}, {v.dtype}")
    if k.shape != v.shape:
        raise ValueError(f"k and v must have the same shape, got {tuple(k.shape)} and {tuple(v.shape)}")
    batch, q_heads, nodes, head_dim = q.shape
    kv_batch, kv_heads, seq, kv_dim = k.shape
    if kv_batch != batch or kv_dim != head_dim:
        raise ValueError(f"k/v shape {tuple(k.shape)} does not match q shape {tuple(q.shape)} in batch or head dim")
    if kv_heads == 0 or q_heads % kv_heads != 0:
        raise ValueError(f"query heads ({q_heads}) must be a multiple of kv heads ({kv_heads})")
    if nodes == 0:
        raise ValueError("q must hold at least one tree node (T >= 1)")
    if nodes > seq:
        raise ValueError(f"T ({nodes}) exceeds the kv length S ({seq}); the tree nodes must be the last T keys")
    if isinstance(tree_mask, torch.Tensor) and tuple(tree_mask.shape) != (batch, nodes, nodes):
        raise ValueError(f"tree_mask must have shape [B, T, T] = {(batch, nodes, nodes)}, got {tuple(tree_mask.shape)}")
    bits = tree_mask if isinstance(tree_mask, TreeMaskBits) else pack_tree_mask(tree_mask)
    expected_words = (batch, nodes, triton.cdiv(nodes, WORD_BITS))
    if tuple(bits.words.shape) != expected_words or bits.words.dtype != torch.int32:
        raise ValueError(
            f"packed tree mask must be int32 {expected_words}, got {bits.words.dtype} {tuple(bits.words.shape)}"
        )
    if out is not None and (out.shape != q.shape or out.dtype != q.dtype):
        raise ValueError(f"out must be {q.dtype} {tuple(q.shape)}, got {out.dtype} {tuple(out.shape)}")
    tensors = [q, k, v, bits.words] + ([] if out is None else [out])
    if len({t.device for t in tensors}) != 1:
        raise ValueError(f"all tensors must be on one device, got {sorted({str(t.device) for t in tensors})}")
    if q.device.type != "cuda" and not INTERPRETED:
        raise ValueError(
            f"tree_attention needs CUDA tensors (got {q.device}); for CPU set TRITON_INTERPRET=1 "
            "before graft_lab.kernels is imported"
        )
    return bits
