"""Attention of a block drafter's rows over a paged KV cache, each row in its own key range.

A block drafter's proposal (docs/model.md §17) puts S query rows at positions P .. P + S - 1
of a sequence whose cache holds positions 0 .. P + S - 1 (its context, then the block's own
K/V): context_lens[b] = P + S. Row j, at q = P + j, sees key k when lo_j <= k < hi_j: lo_j =
max(0, q - window + 1) under a window (else 0); hi_j = q + 1 when causal, else P + S (the whole
block), and at most q + window under a window (|q - k| < window).

One program per (sequence, KV head) reads each BN-key tile once for the S x GROUP queries of
that KV head, packed as the rows of one tile (tile row r: block row r // GROUP, query head
kvh * GROUP + r % GROUP), from the first tile any row sees to the last, with an online softmax in
fp32 and P rounded to the operand dtype before P @ V (as `decode.py` does). The ranges come from
context_lens on the device, so a CUDA graph captures one launch for every context. A row with no
visible key (none with context_lens[b] >= S) gets zeros.
"""

# Triton's annotations misread valid kernel code: constexpr arguments and branches,
# num_warps/num_stages.
# pyright: reportArgumentType=false, reportCallIssue=false, reportOperatorIssue=false

from __future__ import annotations

from typing import NamedTuple

import torch
import triton
import triton.language as tl
from sparkinfer.kernels._triton import check_device, dot_dtype, dot_precision, dot_tile
from sparkinfer.kernels.paged_attention.checks import (
    check_block_tables,
    check_cache,
    check_index,
)

LOG2E = 1.4426950408889634


@triton.jit
def _block_attention_kernel(
    p_q, p_k, p_v, p_ctx, p_bt, p_o,
    qk_scale,
    stride_qb, stride_qs, stride_qh, stride_kb, stride_ks, stride_kh, stride_vb, stride_vs,
    stride_vh, stride_btb, stride_ob, stride_os, stride_oh,
    S: tl.constexpr, GROUP: tl.constexpr, BR: tl.constexpr, BLOCK_SIZE: tl.constexpr,
    D: tl.constexpr, BD: tl.constexpr, BN: tl.constexpr, WINDOW: tl.constexpr,
    IS_CAUSAL: tl.constexpr, DOT_DTYPE: tl.constexpr, DOT_PRECISION: tl.constexpr,
):  # fmt: skip
    i_b, i_kvh = tl.program_id(0).to(tl.int64), tl.program_id(1).to(tl.int64)
    ctx_len = tl.load(p_ctx + i_b)
    anchor = ctx_len - S
    o_r = tl.arange(0, BR)
    m_r = o_r < S * GROUP
    o_j = o_r // GROUP  # each tile row's block row
    o_h = i_kvh * GROUP + o_r % GROUP  # and its query head
    q_pos = anchor + o_j
    o_d = tl.arange(0, BD)
    m_d = o_d < D
    m_rd = m_r[:, None] & m_d[None, :]
    b_q = tl.load(p_q + i_b * stride_qb + o_j[:, None] * stride_qs + o_h[:, None] * stride_qh
                  + o_d[None, :], mask=m_rd, other=0.0).to(DOT_DTYPE)  # fmt: skip
    if WINDOW > 0:
        lo = tl.maximum(q_pos - WINDOW + 1, 0)
        start = tl.maximum(anchor - WINDOW + 1, 0) // BN * BN  # the first tile row 0 sees
    else:
        lo = q_pos * 0
        start = 0
    hi = q_pos * 0 + ctx_len
    if IS_CAUSAL:
        hi = q_pos + 1
    if WINDOW > 0:
        hi = tl.minimum(hi, q_pos + WINDOW)
    p_bt += i_b * stride_btb
    b_acc = tl.zeros((BR, BD), dtype=tl.float32)
    b_m = tl.full((BR,), float("-inf"), dtype=tl.float32)
    b_l = tl.zeros((BR,), dtype=tl.float32)
    for n0 in range(start, ctx_len, BN):
        o_n = n0 + tl.arange(0, BN)
        m_n = o_n < ctx_len
        b_blk = tl.load(p_bt + o_n // BLOCK_SIZE, mask=m_n, other=0).to(tl.int64)
        o_row = o_n % BLOCK_SIZE
        m_kv = m_n[:, None] & m_d[None, :]
        o_k = b_blk * stride_kb + o_row * stride_ks + i_kvh * stride_kh
        b_k = tl.load(p_k + o_k[:, None] + o_d[None, :], mask=m_kv, other=0.0)
        b_s = tl.dot(b_q, tl.trans(b_k.to(DOT_DTYPE)), input_precision=DOT_PRECISION)
        b_s = b_s * qk_scale  # [BR, BN], log2 domain
        seen = (o_n[None, :] >= lo[:, None]) & (o_n[None, :] < hi[:, None]) & m_n[None, :]
        b_s = tl.where(seen, b_s, float("-inf"))
        b_m_new = tl.maximum(b_m, tl.max(b_s, axis=1))
        b_m_safe = tl.where(b_m_new == float("-inf"), 0.0, b_m_new)  # a row that saw no key yet
        b_p = tl.exp2(b_s - b_m_safe[:, None])
        b_alpha = tl.exp2(b_m - b_m_safe)
        b_l = b_l * b_alpha + tl.sum(b_p, axis=1)
        o_v = b_blk * stride_vb + o_row * stride_vs + i_kvh * stride_vh
        b_v = tl.load(p_v + o_v[:, None] + o_d[None, :], mask=m_kv, other=0.0)
        b_acc = tl.dot(
            b_p.to(DOT_DTYPE),
            b_v.to(DOT_DTYPE),
            b_acc * b_alpha[:, None],
            input_precision=DOT_PRECISION,
        )
        b_m = b_m_new
    b_o = b_acc / tl.where(b_l > 0, b_l, 1.0)[:, None]
    p_o += i_b * stride_ob + o_j[:, None] * stride_os + o_h[:, None] * stride_oh + o_d[None, :]
    tl.store(p_o, b_o.to(p_o.dtype.element_ty), mask=m_rd)


class BlockTiles(NamedTuple):
    """The kernel's tiles along its dots: BR packed rows (block rows x query heads of one KV
    head), BD head-dim columns."""

    BR: int
    BD: int


def block_tiles(rows: int, group: int, d: int) -> BlockTiles:
    """Tiles for S block rows of GROUP query heads per KV head and D dims, each at least
    MIN_DOT_TILE, so any block, group and head dim give valid tl.dot shapes."""
    return BlockTiles(BR=dot_tile(rows * group), BD=dot_tile(d))


def _check(q, k_cache, v_cache, context_lens, block_tables) -> None:
    op = "paged_attention_block"
    tensors = {"q": q, "k_cache": k_cache, "v_cache": v_cache, "context_lens": context_lens,
               "block_tables": block_tables}  # fmt: skip
    check_device(op, tensors)
    check_cache(op, k_cache, v_cache)
    hkv, d = k_cache.shape[2], k_cache.shape[3]
    if q.dim() != 4 or q.shape[3] != d or q.shape[2] % hkv:
        raise ValueError(
            f"{op}: q has shape {list(q.shape)}; expected [B, S, H, {d}] with H a multiple of "
            f"HKV={hkv}"
        )
    if q.dtype != k_cache.dtype or q.stride(-1) != 1:
        raise ValueError(
            f"{op}: q is {q.dtype} with strides {q.stride()}; expected the cache's "
            f"{k_cache.dtype} and a unit last stride"
        )
    check_index(op, "context_lens", context_lens, (q.shape[0],))
    check_block_tables(op, block_tables, q.shape[0])


def paged_attention_block(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    *,
    context_lens: torch.Tensor,
    block_tables: torch.Tensor,
    scale: float,
    window: int | None = None,
    is_causal: bool = False,
) -> torch.Tensor:
    """Attention of each sequence's block of S rows (the last S of its context_lens[b] cached
    positions, their K and V already in the cache) over its cache, row j in its own key range
    (the module docstring).

    Args:
        q: [B, S, H, D] the block rows' queries (unit last stride).
        k_cache, v_cache: [num_blocks, block_size, HKV, D], q's dtype, block_size a power of two
            >= 16.
        context_lens: [B] int32 contiguous, the cached positions through each block's last row.
        block_tables: [B, max_blocks] int32 cache blocks of each sequence, in order.
        scale: softmax scale, usually D ** -0.5.
        window: a key is seen while |q_pos - k_pos| < window (None: no window).
        is_causal: a row sees no later row of its block.

    Returns:
        o: [B, S, H, D] contiguous in q.dtype (softmax and accumulation in fp32).
    """
    _check(q, k_cache, v_cache, context_lens, block_tables)
    b, s, h, d = q.shape
    o = torch.empty(q.shape, dtype=q.dtype, device=q.device)
    if b == 0:
        return o
    hkv, group = k_cache.shape[2], h // k_cache.shape[2]
    tiles = block_tiles(s, group, d)
    on_gpu = q.is_cuda
    _block_attention_kernel[(b, hkv)](
        q, k_cache, v_cache, context_lens, block_tables, o,
        scale * LOG2E,
        q.stride(0), q.stride(1), q.stride(2), *k_cache.stride()[:3], *v_cache.stride()[:3],
        block_tables.stride(0), o.stride(0), o.stride(1), o.stride(2),
        S=s, GROUP=group, BR=tiles.BR, BLOCK_SIZE=k_cache.shape[1], D=d, BD=tiles.BD,
        BN=64 if on_gpu else 16, WINDOW=window or 0, IS_CAUSAL=is_causal,
        DOT_DTYPE=dot_dtype(q), DOT_PRECISION=dot_precision(q), num_warps=4 if on_gpu else 1,
        num_stages=2 if on_gpu else 1,
    )  # fmt: skip
    return o
