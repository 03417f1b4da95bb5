"""Hopper variant of the paged prefill kernel: tile loads go through TMA tensor descriptors.

The caches are viewed as 2-D [num_blocks * block_size, HKV * D]. When block_size is a multiple of
BN, a BN-key tile lies inside one cache block, so key tile n0 of a sequence is the descriptor box
at row block_table[n0 // block_size] * block_size + n0 % block_size, column kvh * D: one bulk copy
per tile instead of per-row address arithmetic. The K box lands in shared memory and feeds the
QK^T product as a transposed view, so no register transpose is needed. q and gate are read
through 2-D [T, (H-1) * stride_h + D] windows, head h at column h * stride_h (any 16-byte-aligned
token and head strides, e.g. per-head halves of one projection), so Q stays in shared memory
as the dots' A operand; a whole output tile is stored through a descriptor, a partial one with
masked stores so rows of the next sequence are left alone. The schedule is prefill.py's: one
program per (query tile, head), latest tiles first, unmasked key tiles then the diagonal. With
`PrefillConfig.heads_fastest` the grid lists every head's tile before the next tile: the GPU
starts the longest tiles of all heads first, so a grid of a few waves ends on short tiles.

With `PrefillConfig.pack_gqa`, `_prefill_tma_packed_kernel` runs one program per (tile, KV head)
whose rows are (token, query head) pairs of that KV head's group, q, gate and o read and written
through pointers (a group of 6 heads does not tile into descriptor boxes): a step of few tokens
fills its tiles, and every K/V tile feeds all the group's heads at once.

With `PrefillConfig.kv_splits` > 1 (a few query tiles over a long cached context: a prefix-cache
hit, the end of a long prompt) a third grid axis cuts the unmasked keys into that many ranges of
whole tiles; the last range's program also takes the diagonal. Each program writes its rows'
normalised partial output and softmax (max, sum) in fp32, and `_merge_splits_kernel` combines
them per (token, head) in split order (no atomics) and applies the gate. Without splits, 24
programs of one query tile each read a 32K context alone, about 1 ms a layer on an H200.
"""

# Triton's annotations misread valid kernel code: constexpr arguments, num_warps/num_stages.
# pyright: reportArgumentType=false, reportCallIssue=false

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
import triton
import triton.language as tl
from sparkinfer.kernels._triton import (
    MIN_DOT_TILE,
    TMA_ALIGN_BYTES,
    dot_dtype,
    tma_aligned,
    tma_device_error,
)
from triton.tools.tensor_descriptor import TensorDescriptor

if TYPE_CHECKING:  # prefill.py imports this module to dispatch
    from sparkinfer.kernels.paged_attention.prefill import PrefillConfig

TMA_DTYPES = (torch.bfloat16, torch.float16)
MAX_BOX = 256  # elements per dimension of one TMA box


@triton.jit
def kv_row(p_bt, n0, BLOCK_SIZE: tl.constexpr):
    """Cache row of key n0: a BN-key tile starting there lies inside one cache block."""
    # TMA coordinates are int32; cache_layout_error keeps num_blocks * block_size below 2**31.
    return tl.load(p_bt + n0 // BLOCK_SIZE) * BLOCK_SIZE + n0 % BLOCK_SIZE


@triton.jit
def _scores(b_q, desc_k, row, kv_col, qk_scale, DOT_DTYPE: tl.constexpr):
    """S = Q K^T * scale [BM, BN] in the log2 domain; K's box feeds the dot as a transposed view."""
    b_k = desc_k.load([row, kv_col]).to(DOT_DTYPE)  # [BN, D]
    return tl.dot(b_q, b_k.T) * qk_scale


@triton.jit
def _fold(b_s, b_v, b_acc, b_m, b_l, DOT_DTYPE: tl.constexpr):
    """Online-softmax update of (acc, m, l) with one tile's scores b_s and values b_v [BN, D]."""
    b_m_new = tl.maximum(b_m, tl.max(b_s, axis=1))
    b_p = tl.exp2(b_s - b_m_new[:, None])
    b_alpha = tl.exp2(b_m - b_m_new)
    b_l = b_l * b_alpha + tl.sum(b_p, axis=1)
    b_acc = b_acc * b_alpha[:, None]
    b_acc = tl.dot(b_p.to(DOT_DTYPE), b_v, b_acc)
    return b_acc, b_m_new, b_l


@triton.jit
def _unmasked_tiles(
    b_q, b_acc, b_m, b_l, n_start, n_full, desc_k, desc_v, p_bt, kv_col, qk_scale,
    BLOCK_SIZE: tl.constexpr, BN: tl.constexpr, USE_QK_PREFETCH: tl.constexpr,
    DOT_DTYPE: tl.constexpr,
):  # fmt: skip
    """Keys n_start..n_full-1 (whole tiles), which every query row of the tile sees: no mask."""
    if USE_QK_PREFETCH:
        # Issue the next tile's Q K^T before this tile's softmax, so the tensor cores work on it
        # while the softmax runs (flash-attention 3's intra-warpgroup overlap).
        if n_full > n_start:
            row = kv_row(p_bt, n_start, BLOCK_SIZE)
            b_s = _scores(b_q, desc_k, row, kv_col, qk_scale, DOT_DTYPE)
            for n0 in range(n_start + BN, n_full, BN):
                row_next = kv_row(p_bt, n0, BLOCK_SIZE)
                b_s_next = _scores(b_q, desc_k, row_next, kv_col, qk_scale, DOT_DTYPE)
                b_v = desc_v.load([row, kv_col]).to(DOT_DTYPE)
                b_acc, b_m, b_l = _fold(b_s, b_v, b_acc, b_m, b_l, DOT_DTYPE)
                b_s, row = b_s_next, row_next
            b_v = desc_v.load([row, kv_col]).to(DOT_DTYPE)
            b_acc, b_m, b_l = _fold(b_s, b_v, b_acc, b_m, b_l, DOT_DTYPE)
    else:
        for n0 in range(n_start, n_full, BN):
            row = kv_row(p_bt, n0, BLOCK_SIZE)
            b_s = _scores(b_q, desc_k, row, kv_col, qk_scale, DOT_DTYPE)
            b_v = desc_v.load([row, kv_col]).to(DOT_DTYPE)
            b_acc, b_m, b_l = _fold(b_s, b_v, b_acc, b_m, b_l, DOT_DTYPE)
    return b_acc, b_m, b_l


@triton.jit
def _grid_lane(HEADS_FASTEST: tl.constexpr):
    """(lane, query tile, lanes, key split) of this program, a lane being a head (or a KV head
    when packed): grid (lanes, tiles, splits) head-first, every lane's latest tile first; else
    (tiles, lanes, splits), one lane's tiles, latest first, then the next lane's."""
    if HEADS_FASTEST:
        i_lane, i_tile, num_lanes = tl.program_id(0), tl.program_id(1), tl.num_programs(0)
    else:
        i_lane, i_tile, num_lanes = tl.program_id(1), tl.program_id(0), tl.num_programs(1)
    return i_lane, i_tile, num_lanes, tl.program_id(2)


@triton.jit
def _tile_sequence(p_tile_seq, p_cu_tiles, p_cu, p_cached, i_tile):
    """(sequence, its end in the tile numbering, first token, new tokens, cached tokens, context
    length) of query tile i_tile; a tile at or past the end is past the grid's last real tile."""
    i_b = tl.load(p_tile_seq + i_tile)
    seq_start = tl.load(p_cu + i_b)
    seq_len = tl.load(p_cu + i_b + 1) - seq_start
    cached = tl.load(p_cached + i_b)
    return i_b, tl.load(p_cu_tiles + i_b + 1), seq_start, seq_len, cached, cached + seq_len


@triton.jit
def _attend_rows(
    b_q, o_pos, pos_lo, pos_end, ctx_len, i_s, desc_k, desc_v, p_bt, kv_col, qk_scale,
    BM: tl.constexpr, BN: tl.constexpr, D: tl.constexpr, BLOCK_SIZE: tl.constexpr,
    USE_QK_PREFETCH: tl.constexpr, KV_SPLITS: tl.constexpr, DOT_DTYPE: tl.constexpr,
):  # fmt: skip
    """Softmax state (acc, m, l) of query rows at positions o_pos (from pos_lo, all below
    pos_end) over split i_s of their keys, and whether the split read any key.

    Keys up to pos_lo are visible to every row: whole tiles of them run unmasked, cut into
    KV_SPLITS ranges; the last split also takes the tiles on the diagonal, masked per row.
    """
    b_acc = tl.zeros((BM, D), dtype=tl.float32)
    b_m = tl.full((BM,), float("-inf"), dtype=tl.float32)
    b_l = tl.zeros((BM,), dtype=tl.float32)
    n_full = (pos_lo + 1) // BN * BN
    split_len = tl.cdiv(n_full // BN, KV_SPLITS) * BN
    n_lo = tl.minimum(i_s * split_len, n_full)
    n_hi = tl.minimum(n_lo + split_len, n_full)
    b_acc, b_m, b_l = _unmasked_tiles(
        b_q, b_acc, b_m, b_l, n_lo, n_hi, desc_k, desc_v, p_bt, kv_col, qk_scale,
        BLOCK_SIZE, BN, USE_QK_PREFETCH, DOT_DTYPE,
    )  # fmt: skip
    n_end = tl.minimum(ctx_len, pos_end)
    if i_s < KV_SPLITS - 1:
        n_end = n_full  # the diagonal belongs to the last split
    for n0 in range(n_full, n_end, BN):
        row = kv_row(p_bt, n0, BLOCK_SIZE)
        b_s = _scores(b_q, desc_k, row, kv_col, qk_scale, DOT_DTYPE)
        o_n = n0 + tl.arange(0, BN)
        m_n = o_n < ctx_len
        b_s = tl.where((o_n[None, :] <= o_pos[:, None]) & m_n[None, :], b_s, float("-inf"))
        # Rows past the context are stale cache contents, possibly NaN: P = 0 does not hide NaN.
        b_v = tl.where(m_n[:, None], desc_v.load([row, kv_col]).to(DOT_DTYPE), 0.0)
        b_acc, b_m, b_l = _fold(b_s, b_v, b_acc, b_m, b_l, DOT_DTYPE)
    return b_acc, b_m, b_l, (n_hi > n_lo) | (i_s == KV_SPLITS - 1)


@triton.jit(do_not_specialize=["stride_btb"])  # sizes of the step: one build for all
def _prefill_tma_kernel(
    desc_q, desc_k, desc_v, desc_g, desc_o, p_o, p_part_o, p_part_ml,
    p_cu, p_cached, p_bt, p_tile_seq, p_cu_tiles,
    qk_scale, stride_qh, stride_gh, stride_ot, stride_oh, stride_btb,
    GROUP: tl.constexpr, BLOCK_SIZE: tl.constexpr, D: tl.constexpr, BM: tl.constexpr,
    BN: tl.constexpr, HAS_GATE: tl.constexpr, USE_QK_PREFETCH: tl.constexpr,
    KV_SPLITS: tl.constexpr, HEADS_FASTEST: tl.constexpr, DOT_DTYPE: tl.constexpr,
):  # fmt: skip
    i_h, i_tile, num_heads, i_s = _grid_lane(HEADS_FASTEST)
    i_b, tile_end, seq_start, seq_len, cached, ctx_len = _tile_sequence(
        p_tile_seq, p_cu_tiles, p_cu, p_cached, i_tile
    )
    if i_tile >= tile_end:
        return
    # Latest tiles first: they have the most keys, so the grid tail is short.
    m_start = (tile_end - 1 - i_tile) * BM
    row0 = seq_start + m_start
    o_pos = cached + m_start + tl.arange(0, BM)  # absolute positions of the query rows

    # Rows past seq_len read the next sequence (or TMA's zero padding): computed, never stored.
    b_q = desc_q.load([row0, i_h * stride_qh]).to(DOT_DTYPE)  # stays in shared memory
    kv_col = (i_h // GROUP) * D
    p_bt += i_b.to(tl.int64) * stride_btb
    b_acc, b_m, b_l, has_keys = _attend_rows(
        b_q, o_pos, cached + m_start, cached + m_start + BM, ctx_len, i_s, desc_k, desc_v, p_bt,
        kv_col, qk_scale, BM, BN, D, BLOCK_SIZE, USE_QK_PREFETCH, KV_SPLITS, DOT_DTYPE,
    )  # fmt: skip

    if KV_SPLITS > 1:
        o_m = m_start + tl.arange(0, BM)
        _store_partial(p_part_o, p_part_ml, b_acc, b_m, b_l, has_keys, seq_start + o_m, i_h,
                       o_m < seq_len, i_s, num_heads, KV_SPLITS, D)  # fmt: skip
        return
    b_o = b_acc / b_l[:, None]
    if HAS_GATE:
        b_g = desc_g.load([row0, i_h * stride_gh]).to(tl.float32)
        b_o = b_o * tl.sigmoid(b_g)
    b_o = b_o.to(p_o.dtype.element_ty)
    if m_start + BM <= seq_len:
        desc_o.store([row0, i_h * D], b_o)
    else:
        o_m = m_start + tl.arange(0, BM)
        o_t = (seq_start + o_m).to(tl.int64)
        p_out = p_o + o_t[:, None] * stride_ot + i_h * stride_oh + tl.arange(0, D)[None, :]
        tl.store(p_out, b_o, mask=(o_m < seq_len)[:, None])


@triton.jit(do_not_specialize=["stride_btb"])  # sizes of the step: one build for all
def _prefill_tma_packed_kernel(
    desc_k, desc_v, p_q, p_g, p_o, p_part_o, p_part_ml,
    p_cu, p_cached, p_bt, p_tile_seq, p_cu_tiles,
    qk_scale, stride_qt, stride_qh, stride_gt, stride_gh, stride_ot, stride_oh, stride_btb,
    GROUP: tl.constexpr, BLOCK_SIZE: tl.constexpr, D: tl.constexpr, BM: tl.constexpr,
    BN: tl.constexpr, HAS_GATE: tl.constexpr, USE_QK_PREFETCH: tl.constexpr,
    KV_SPLITS: tl.constexpr, HEADS_FASTEST: tl.constexpr, DOT_DTYPE: tl.constexpr,
):  # fmt: skip
    """`_prefill_tma_kernel` with the GROUP query heads of one KV head packed into the rows of a
    tile: packed row r of a sequence is token r // GROUP, head kvh * GROUP + r % GROUP, so a
    step of few tokens fills its tiles and each K/V tile serves every head of its group."""
    i_kvh, i_tile, num_kv_heads, i_s = _grid_lane(HEADS_FASTEST)
    num_heads = GROUP * num_kv_heads
    i_b, tile_end, seq_start, seq_len, cached, ctx_len = _tile_sequence(
        p_tile_seq, p_cu_tiles, p_cu, p_cached, i_tile
    )
    if i_tile >= tile_end:
        return
    r_start = (tile_end - 1 - i_tile) * BM  # latest tiles first, as the unpacked kernel
    o_r = r_start + tl.arange(0, BM)
    o_m = o_r // GROUP  # token of each row within the sequence
    o_h = i_kvh * GROUP + o_r % GROUP  # query head of each row
    m_rows = o_m < seq_len
    o_t = (seq_start + o_m).to(tl.int64)
    o_d = tl.arange(0, D)
    b_q = tl.load(p_q + o_t[:, None] * stride_qt + o_h[:, None] * stride_qh + o_d[None, :],
                  mask=m_rows[:, None], other=0.0).to(DOT_DTYPE)  # fmt: skip
    o_pos = cached + o_m
    last = tl.minimum((r_start + BM - 1) // GROUP, seq_len - 1)
    p_bt += i_b.to(tl.int64) * stride_btb
    b_acc, b_m, b_l, has_keys = _attend_rows(
        b_q, o_pos, cached + r_start // GROUP, cached + last + 1, ctx_len, i_s, desc_k, desc_v,
        p_bt, i_kvh * D, qk_scale, BM, BN, D, BLOCK_SIZE, USE_QK_PREFETCH, KV_SPLITS, DOT_DTYPE,
    )  # fmt: skip

    if KV_SPLITS > 1:
        _store_partial(p_part_o, p_part_ml, b_acc, b_m, b_l, has_keys, o_t, o_h, m_rows, i_s,
                       num_heads, KV_SPLITS, D)  # fmt: skip
        return
    b_o = b_acc / b_l[:, None]
    if HAS_GATE:
        b_g = tl.load(p_g + o_t[:, None] * stride_gt + o_h[:, None] * stride_gh + o_d[None, :],
                      mask=m_rows[:, None], other=0.0).to(tl.float32)  # fmt: skip
        b_o = b_o * tl.sigmoid(b_g)
    p_out = p_o + o_t[:, None] * stride_ot + o_h[:, None] * stride_oh + o_d[None, :]
    tl.store(p_out, b_o.to(p_o.dtype.element_ty), mask=m_rows[:, None])


@triton.jit
def _store_partial(
    p_part_o, p_part_ml, b_acc, b_m, b_l, has_keys, o_t, o_h, m_rows, i_s, num_heads,
    KV_SPLITS: tl.constexpr, D: tl.constexpr,
):  # fmt: skip
    """A split's rows (token o_t, head o_h, stored where m_rows): (m, l) [T, H, KV_SPLITS, 2] fp32
    always (l = 0: no keys), and the normalised o [T, H, KV_SPLITS, D] fp32 when it read any
    key (the merge reads o where l > 0)."""
    o_part = (o_t.to(tl.int64) * num_heads + o_h) * KV_SPLITS + i_s  # [BM]
    if has_keys:
        b_o = b_acc / b_l[:, None]
        tl.store(p_part_o + o_part[:, None] * D + tl.arange(0, D)[None, :], b_o,
                 mask=m_rows[:, None])  # fmt: skip
    tl.store(p_part_ml + o_part * 2, b_m, mask=m_rows)
    tl.store(p_part_ml + o_part * 2 + 1, b_l, mask=m_rows)


@triton.jit
def _merge_splits_kernel(
    p_part_o, p_part_ml, p_gate, p_o, stride_gt, stride_gh, stride_ot, stride_oh,
    D: tl.constexpr, KV_SPLITS: tl.constexpr, HAS_GATE: tl.constexpr,
):  # fmt: skip
    """o[t, h] = the splits' partial outputs weighted by their softmax sums, in split order."""
    i_t, i_h = tl.program_id(0).to(tl.int64), tl.program_id(1).to(tl.int64)
    o_part = (i_t * tl.num_programs(1) + i_h) * KV_SPLITS + tl.arange(0, KV_SPLITS)
    b_m = tl.load(p_part_ml + o_part * 2)
    b_l = tl.load(p_part_ml + o_part * 2 + 1)
    b_max = tl.max(b_m, axis=0)
    m_s = b_l > 0  # splits that read keys; the others wrote no o
    b_w = tl.where(m_s, tl.exp2(b_m - b_max) * b_l, 0.0)
    b_w = b_w / tl.sum(b_w, axis=0)
    o_d = tl.arange(0, D)
    b_parts = tl.load(p_part_o + o_part[:, None] * D + o_d[None, :], mask=m_s[:, None], other=0.0)
    b_o = tl.sum(b_w[:, None] * b_parts, axis=0)
    if HAS_GATE:
        b_g = tl.load(p_gate + i_t * stride_gt + i_h * stride_gh + o_d).to(tl.float32)
        b_o = b_o * tl.sigmoid(b_g)
    tl.store(p_o + i_t * stride_ot + i_h * stride_oh + o_d, b_o.to(p_o.dtype.element_ty))


def cache_layout_error(k_cache: torch.Tensor, v_cache: torch.Tensor, bn: int) -> str | None:
    """Why descriptors over the caches as [blocks * block_size, HKV * D] rows cannot give every
    bn-key tile of a block as one box, or None when they can."""
    num_blocks, block_size, _, d = k_cache.shape
    if k_cache.dtype not in TMA_DTYPES:
        return f"TMA path takes bf16 or fp16; got {k_cache.dtype}"
    if (
        d & (d - 1)
        or not MIN_DOT_TILE <= d <= MAX_BOX
        or d * k_cache.element_size() < TMA_ALIGN_BYTES
    ):
        # (a box is one tl.dot operand D wide, and at least TMA_ALIGN_BYTES)
        return f"D={d} is not a power of two with {MIN_DOT_TILE} <= D <= {MAX_BOX} elements"
    if block_size % bn or bn > MAX_BOX:
        return f"block_size {block_size} is not a multiple of BN={bn} (or BN exceeds {MAX_BOX})"
    if num_blocks * block_size >= 2**31:
        return f"{num_blocks * block_size} cache rows overflow int32 TMA coordinates"
    for name, cache in (("k_cache", k_cache), ("v_cache", v_cache)):
        if cache.stride(2) != d or cache.stride(0) != block_size * cache.stride(1):
            return f"{name} strides {cache.stride()} do not flatten to [rows, HKV*D]"
        if not tma_aligned(cache, cache.stride(1)):
            return f"{name} base or row stride {cache.stride(1)} is not 16-byte aligned"
    return None


def tma_layout_error(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    gate: torch.Tensor | None,
    config: PrefillConfig,
) -> str | None:
    """Why these (already checked) inputs cannot take the TMA kernel, or None when they can."""
    device_error = tma_device_error(q)
    if device_error is not None:
        return device_error
    if max(config.BM, config.BN) > MAX_BOX:
        return f"BM={config.BM} or BN={config.BN} exceeds {MAX_BOX}"
    cache_error = cache_layout_error(k_cache, v_cache, config.BN)
    if cache_error is not None:
        return cache_error
    for name, t in (("q", q), ("gate", gate)):
        if t is not None and not tma_aligned(t, t.stride(0), t.stride(1)):
            return f"{name} base or strides {t.stride()} are not 16-byte aligned"
    return None


def launch_prefill_tma(
    o: torch.Tensor,
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    *,
    gate: torch.Tensor | None,
    index: tuple[torch.Tensor, torch.Tensor, torch.Tensor],
    tile_map: tuple[torch.Tensor, torch.Tensor, int],
    qk_scale: float,
    config: PrefillConfig,
) -> None:
    """Fill o [T, H, D] (contiguous) with the TMA kernel; inputs passed tma_layout_error.

    index is (cu_seqlens, cached_lens, block_tables); tile_map is prefill._tile_map's result
    over the tiles' rows: tokens, or (token, head) pairs of a KV head with config.pack_gqa.
    """
    num_tokens, num_heads, d = q.shape
    bm, bn = config.BM, config.BN
    rows = k_cache.shape[0] * k_cache.shape[1]
    hkv = k_cache.shape[2]

    def _kv(cache: torch.Tensor) -> TensorDescriptor:
        return TensorDescriptor(cache, [rows, hkv * d], [cache.stride(1), 1], [bn, d])

    def _heads(t: torch.Tensor) -> TensorDescriptor:
        # A 2-D window [T, (H-1) * stride_h + D]: head h is the box at column h * stride_h. A
        # 2-D box (no reshape) lets Q feed the dots from shared memory instead of 64 registers.
        cols = (num_heads - 1) * t.stride(1) + d
        return TensorDescriptor(t, [num_tokens, cols], [t.stride(0), 1], [bm, d])

    g = gate if gate is not None else q
    cu_seqlens, cached_lens, block_tables = index
    tile_seq, cu_tiles, grid = tile_map
    splits = config.kv_splits
    part_o = part_ml = o  # unused without splits
    if splits > 1:
        part_o = torch.empty(num_tokens, num_heads, splits, d, dtype=torch.float32, device=q.device)
        part_ml = torch.empty(num_tokens, num_heads, splits, 2, dtype=torch.float32,
                              device=q.device)  # fmt: skip
    lanes = hkv if config.pack_gqa else num_heads  # programs across the heads
    launch_grid = (lanes, grid, splits) if config.heads_fastest else (grid, lanes, splits)
    constants = {
        "GROUP": num_heads // hkv, "BLOCK_SIZE": k_cache.shape[1], "D": d, "BM": bm, "BN": bn,
        "HAS_GATE": gate is not None, "USE_QK_PREFETCH": config.use_qk_prefetch,
        "KV_SPLITS": splits, "HEADS_FASTEST": config.heads_fastest, "DOT_DTYPE": dot_dtype(q),
        "num_warps": config.num_warps, "num_stages": config.num_stages,
    }  # fmt: skip
    if config.pack_gqa:
        _prefill_tma_packed_kernel[launch_grid](
            _kv(k_cache), _kv(v_cache), q, g, o, part_o, part_ml,
            cu_seqlens, cached_lens, block_tables, tile_seq, cu_tiles, qk_scale,
            q.stride(0), q.stride(1), g.stride(0), g.stride(1), o.stride(0), o.stride(1),
            block_tables.stride(0), **constants,
        )  # fmt: skip
    else:
        desc_o = TensorDescriptor(o, [num_tokens, num_heads * d], [o.stride(0), 1], [bm, d])
        _prefill_tma_kernel[launch_grid](
            _heads(q), _kv(k_cache), _kv(v_cache), _heads(g), desc_o, o, part_o, part_ml,
            cu_seqlens, cached_lens, block_tables, tile_seq, cu_tiles,
            qk_scale, q.stride(1), g.stride(1), o.stride(0), o.stride(1), block_tables.stride(0),
            **constants,
        )  # fmt: skip
    if splits > 1:
        _merge_splits_kernel[(num_tokens, num_heads)](
            part_o, part_ml, g, o, g.stride(0), g.stride(1), o.stride(0), o.stride(1),
            D=d, KV_SPLITS=splits, HAS_GATE=gate is not None, num_warps=4,
        )  # fmt: skip
