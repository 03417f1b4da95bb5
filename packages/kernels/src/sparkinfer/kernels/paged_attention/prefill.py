"""Causal varlen attention over a paged KV cache, for prefill chunks with a cached prefix.

One program computes BM query rows of one query head of one sequence (flash attention: online
softmax in fp32 over BN-key tiles gathered through the block table), then applies the sigmoid
output gate. Query tiles of all sequences are numbered in one grid axis without a host sync: a
small device-side map sends each tile to its sequence. Within a sequence the latest (longest)
tiles run first. `PrefillConfig.use_tma` selects the Hopper variant in prefill_tma.py (descriptor
tile loads) whenever the layout allows it; otherwise this pointer kernel runs.
"""

# Triton's annotations misread valid kernel code: constexpr arguments, num_warps/num_stages.
# pyright: reportArgumentType=false, reportCallIssue=false

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import torch
import triton
import triton.language as tl
from sparkinfer.kernels._triton import (
    IndexCache,
    cached_index_tables,
    check_device,
    dot_dtype,
    dot_tile,
    num_multiprocessors,
)
from sparkinfer.kernels.linear.invariant import current_phase
from sparkinfer.kernels.paged_attention.checks import (
    check_block_tables,
    check_cache,
    check_heads,
    check_index,
)
from sparkinfer.kernels.paged_attention.prefill_tma import launch_prefill_tma, tma_layout_error

LOG2E = 1.4426950408889634
# KV splits: a grid short of KV_SPLIT_BELOW programs per SM (a few query tiles over a long
# cached context) has its tiles' keys cut into up to MAX_KV_SPLITS ranges run side by side, as
# many as bring it to KV_SPLIT_PROGRAMS_PER_SM: a few rows over a long cached context then fill
# the GPU instead of a handful of its multiprocessors. Packed tiles (at most 64 rows: 4-16
# programs) take 32 splits (the paged attention kernel record, docs/benchmarks.md).
KV_SPLIT_BELOW = 2
KV_SPLIT_PROGRAMS_PER_SM = 3
MAX_KV_SPLITS = 32
# Grids of at most this many waves of (query tile, head) programs start every head's longest
# tile first (PrefillConfig.heads_fastest): with few waves the causal grid's tail of long tiles
# costs more than the K/V locality of one head's tiles running together; with many waves the
# locality wins (the paged attention kernel record, docs/benchmarks.md).
HEADS_FASTEST_MAX_WAVES = 8
# Steps of at most this many new rows (a prefix-cache hit's short question) pack each KV head's
# query heads into 128-row tiles (PrefillConfig.pack_gqa): one head a tile would leave most of
# a tile's rows empty; past this many rows packing stops paying (the paged attention kernel
# record, docs/benchmarks.md).
PACKED_MAX_ROWS = 64


@dataclass(frozen=True)
class PrefillConfig:
    """Tile sizes and launch parameters of the prefill kernel.

    use_tma takes the TMA-descriptor kernel (prefill_tma.py) when the inputs allow it (Hopper or
    the interpreter, bf16/fp16, block_size a multiple of BN, 16-byte-aligned strides) and the
    pointer kernel otherwise. use_qk_prefetch (TMA kernel only) issues the next key tile's
    Q K^T before the current tile's softmax. kv_splits (TMA kernel only, a power of two) cuts
    each query tile's keys into that many ranges run by separate programs, merged after.
    heads_fastest (TMA kernel only) orders the grid head-first, so the longest tiles of every
    head start first; the outputs are the same bits either way. pack_gqa (TMA kernel only) packs
    the query heads of one KV head into a tile's rows ((token, head) pairs), so a step of few
    tokens fills its tiles and each K/V tile serves the whole group.
    """

    BM: int = 128
    BN: int = 64
    num_warps: int = 8
    num_stages: int = 3
    use_tma: bool = False
    use_qk_prefetch: bool = False
    kv_splits: int = 1
    heads_fastest: bool = False
    pack_gqa: bool = False

    def __post_init__(self) -> None:
        for name, tile in (("BM", self.BM), ("BN", self.BN)):
            if tile < 16 or tile & (tile - 1):
                raise ValueError(f"PrefillConfig.{name} is {tile}; expected a power of two >= 16")
        if self.num_warps not in (1, 2, 4, 8, 16) or self.num_stages < 1:
            raise ValueError(
                f"PrefillConfig has num_warps={self.num_warps}, num_stages={self.num_stages}; "
                "expected num_warps a power of two <= 16 and num_stages >= 1"
            )
        if self.kv_splits < 1 or self.kv_splits & (self.kv_splits - 1):
            raise ValueError(
                f"PrefillConfig.kv_splits is {self.kv_splits}; expected a power of two >= 1"
            )
        is_tma_only = self.use_qk_prefetch or self.kv_splits > 1 or self.heads_fastest
        if (is_tma_only or self.pack_gqa) and not self.use_tma:
            raise ValueError("PrefillConfig.use_qk_prefetch, kv_splits, heads_fastest and pack_gqa "
                             "apply to the TMA kernel only: set use_tma=True too")  # fmt: skip


@triton.jit
def _attend_tile(
    b_q, b_acc, b_m, b_l, n0, o_pos, ctx_len,
    p_k, p_v, p_bt, kvh_off_k, kvh_off_v,
    stride_kb, stride_ks, stride_vb, stride_vs, qk_scale,
    IS_MASKED: tl.constexpr, BLOCK_SIZE: tl.constexpr, BN: tl.constexpr, BD: tl.constexpr,
    D: tl.constexpr, DOT_DTYPE: tl.constexpr,
):  # fmt: skip
    """Fold keys n0..n0+BN-1 into the running softmax state of one query tile."""
    o_n = n0 + tl.arange(0, BN)
    o_d = tl.arange(0, BD)
    m_d = o_d < D
    m_n = o_n < ctx_len
    b_blk = tl.load(p_bt + o_n // BLOCK_SIZE, mask=m_n, other=0).to(tl.int64)
    o_row = o_n % BLOCK_SIZE
    o_k = b_blk * stride_kb + o_row * stride_ks + kvh_off_k  # [BN] int64
    o_v = b_blk * stride_vb + o_row * stride_vs + kvh_off_v
    m_kv = m_n[:, None] & m_d[None, :]
    b_k = tl.load(p_k + o_k[:, None] + o_d[None, :], mask=m_kv, other=0.0)
    b_s = tl.dot(b_q, tl.trans(b_k.to(DOT_DTYPE))) * qk_scale  # [BM, BN], log2 domain
    if IS_MASKED:
        m_s = (o_n[None, :] <= o_pos[:, None]) & m_n[None, :]
        b_s = tl.where(m_s, b_s, float("-inf"))
    b_m_new = tl.maximum(b_m, tl.max(b_s, axis=1))
    b_p = tl.exp2(b_s - b_m_new[:, None])
    b_alpha = tl.exp2(b_m - b_m_new)
    b_l = b_l * b_alpha + tl.sum(b_p, axis=1)
    b_v = tl.load(p_v + o_v[:, None] + o_d[None, :], mask=m_kv, other=0.0)
    b_acc = b_acc * b_alpha[:, None]
    b_acc = tl.dot(b_p.to(DOT_DTYPE), b_v.to(DOT_DTYPE), b_acc)
    return b_acc, b_m_new, b_l


@triton.jit(do_not_specialize=["stride_btb"])  # sizes of the step: one build for all
def _prefill_kernel(
    p_q, p_k, p_v, p_gate, p_o,
    p_cu, p_cached, p_bt, p_tile_seq, p_cu_tiles,
    qk_scale,
    stride_qt, stride_qh, stride_gt, stride_gh, stride_ot, stride_oh,
    stride_kb, stride_ks, stride_kh, stride_vb, stride_vs, stride_vh, stride_btb,
    GROUP: tl.constexpr, BLOCK_SIZE: tl.constexpr, D: tl.constexpr, BD: tl.constexpr,
    BM: tl.constexpr, BN: tl.constexpr, HAS_GATE: tl.constexpr, DOT_DTYPE: tl.constexpr,
):  # fmt: skip
    i_tile, i_h = tl.program_id(0), tl.program_id(1)
    i_b = tl.load(p_tile_seq + i_tile)
    tile_end = tl.load(p_cu_tiles + i_b + 1)
    if i_tile >= tile_end:
        return
    seq_start = tl.load(p_cu + i_b).to(tl.int64)
    seq_len = tl.load(p_cu + i_b + 1) - tl.load(p_cu + i_b)
    cached = tl.load(p_cached + i_b)
    ctx_len = cached + seq_len
    # Latest tiles first: they have the most keys, so the grid tail is short.
    m_start = (tile_end - 1 - i_tile) * BM

    o_m = m_start + tl.arange(0, BM)
    o_d = tl.arange(0, BD)
    m_m = o_m < seq_len
    m_q = m_m[:, None] & (o_d < D)[None, :]
    o_t = seq_start + o_m.to(tl.int64)
    o_pos = cached + o_m  # absolute positions of the query rows
    b_q = tl.load(p_q + o_t[:, None] * stride_qt + i_h * stride_qh + o_d[None, :], mask=m_q,
                  other=0.0).to(DOT_DTYPE)  # fmt: skip

    kvh = (i_h // GROUP).to(tl.int64)
    p_bt += i_b.to(tl.int64) * stride_btb
    b_acc = tl.zeros((BM, BD), dtype=tl.float32)
    b_m = tl.full((BM,), float("-inf"), dtype=tl.float32)
    b_l = tl.zeros((BM,), dtype=tl.float32)
    # Keys up to the first row's position are visible to every row: no mask needed there.
    n_full = (cached + m_start + 1) // BN * BN
    for n0 in range(0, n_full, BN):
        b_acc, b_m, b_l = _attend_tile(
            b_q, b_acc, b_m, b_l, n0, o_pos, ctx_len, p_k, p_v, p_bt,
            kvh * stride_kh, kvh * stride_vh, stride_kb, stride_ks, stride_vb, stride_vs, qk_scale,
            False, BLOCK_SIZE, BN, BD, D, DOT_DTYPE,
        )  # fmt: skip
    n_end = tl.minimum(ctx_len, cached + m_start + BM)
    for n0 in range(n_full, n_end, BN):
        b_acc, b_m, b_l = _attend_tile(
            b_q, b_acc, b_m, b_l, n0, o_pos, ctx_len, p_k, p_v, p_bt,
            kvh * stride_kh, kvh * stride_vh, stride_kb, stride_ks, stride_vb, stride_vs, qk_scale,
            True, BLOCK_SIZE, BN, BD, D, DOT_DTYPE,
        )  # fmt: skip

    b_o = b_acc / b_l[:, None]
    if HAS_GATE:
        b_g = tl.load(p_gate + o_t[:, None] * stride_gt + i_h * stride_gh + o_d[None, :], mask=m_q,
                      other=0.0).to(tl.float32)  # fmt: skip
        b_o = b_o * tl.sigmoid(b_g)
    p_o += o_t[:, None] * stride_ot + i_h * stride_oh + o_d[None, :]
    tl.store(p_o, b_o.to(p_o.dtype.element_ty), mask=m_q)


def default_prefill_config(q: torch.Tensor, num_kv_heads: int) -> PrefillConfig:
    """Tiles measured for D=256 on CUDA (docs/benchmarks.md); small tiles for the CPU interpreter.

    On CUDA the TMA kernel is asked for (faster than the pointer kernel over long prompts);
    layouts it cannot read fall back to the pointer kernel (`tma_layout_error`). Outside
    a batch-invariant phase a step of at most PACKED_MAX_ROWS rows packs the query heads of each
    of its num_kv_heads KV heads into the tiles' rows, and the keys are split when q's rows
    make few query tiles (`choose_kv_splits`; counted as if one sequence held them all, so the
    empty sequences that pad a CUDA-graph step do not count); inside one a row's numerics never
    depend on the batch. A grid of at most HEADS_FASTEST_MAX_WAVES waves is ordered head-first
    (the order never changes the bits).
    """
    if not q.is_cuda:
        return PrefillConfig(BM=16, BN=16, num_warps=4, num_stages=1)
    if q.shape[-1] <= 128:
        return PrefillConfig(BM=128, BN=64, num_warps=4, num_stages=3)
    num_sms = num_multiprocessors(q.device)
    config = PrefillConfig(BM=128, BN=64, num_warps=8, num_stages=2, use_tma=True)
    rows_per_token, lanes = 1, q.shape[1]  # programs across the heads: one a head
    if current_phase() is None and q.shape[0] <= PACKED_MAX_ROWS:
        config = dataclasses.replace(config, pack_gqa=True)
        rows_per_token, lanes = q.shape[1] // num_kv_heads, num_kv_heads  # one a KV head
    num_programs = (triton.cdiv(q.shape[0] * rows_per_token, config.BM) + 1) * lanes
    # The order of the grid never changes a row's bits: it is chosen in every phase.
    config = dataclasses.replace(config, heads_fastest=is_heads_first(num_programs, num_sms))
    if current_phase() is not None:
        return config
    return dataclasses.replace(config, kv_splits=choose_kv_splits(num_programs, num_sms))


def prefill_variant_lengths(
    num_heads: int, num_kv_heads: int, head_dim: int, max_rows: int, device: torch.device
) -> tuple[int, ...]:
    """For each config `default_prefill_config` picks for steps of 1..max_rows new rows on
    `device` in the current phase, the shortest such step: run once each, steps of these
    lengths build every variant of the kernel (key splits, grid order, packed heads) that
    steps up to max_rows rows take. The config depends on a step's row count alone."""
    probe = torch.empty((1, num_heads, head_dim), dtype=torch.bfloat16, device=device)
    shortest: dict[PrefillConfig, int] = {}
    for num_rows in range(1, max_rows + 1):
        config = default_prefill_config(probe.expand(num_rows, -1, -1), num_kv_heads)
        shortest.setdefault(config, num_rows)
    return tuple(sorted(shortest.values()))


def is_heads_first(num_programs: int, num_sms: int) -> bool:
    """Whether a grid of `num_programs` (query tile, head) programs runs head-first: at most
    HEADS_FASTEST_MAX_WAVES waves of them."""
    return num_programs <= HEADS_FASTEST_MAX_WAVES * num_sms


def choose_kv_splits(num_programs: int, num_sms: int) -> int:
    """KV splits for a grid of `num_programs` (query tile, head) programs: 1 from KV_SPLIT_BELOW
    programs per SM, else the power of two, at most MAX_KV_SPLITS, that brings it to
    KV_SPLIT_PROGRAMS_PER_SM. A split with no keys to read costs one (max, sum) pair a row."""
    if num_programs >= KV_SPLIT_BELOW * num_sms:
        return 1
    wanted = triton.cdiv(KV_SPLIT_PROGRAMS_PER_SM * num_sms, max(num_programs, 1))
    return min(MAX_KV_SPLITS, triton.next_power_of_2(wanted))


def _check(q, k_cache, v_cache, cu_seqlens, cached_lens, block_tables, gate) -> None:
    op = "paged_attention_prefill"
    tensors = {"q": q, "k_cache": k_cache, "v_cache": v_cache, "cu_seqlens": cu_seqlens,
               "cached_lens": cached_lens, "block_tables": block_tables}  # fmt: skip
    if gate is not None:
        tensors["gate"] = gate
    check_device(op, tensors)
    check_cache(op, k_cache, v_cache)
    check_heads(op, "q", q, None, k_cache)
    if gate is not None and gate.shape != q.shape:
        raise ValueError(f"{op}: gate has shape {list(gate.shape)}; expected q's {list(q.shape)}")
    if gate is not None:
        check_heads(op, "gate", gate, q.shape[0], k_cache)
    num_seqs = cu_seqlens.shape[0] - 1 if cu_seqlens.dim() == 1 else -1
    check_index(op, "cu_seqlens", cu_seqlens, (max(num_seqs, 0) + 1,))
    check_index(op, "cached_lens", cached_lens, (num_seqs,))
    check_block_tables(op, block_tables, num_seqs)


def _tile_map(
    cu_seqlens: torch.Tensor, num_tokens: int, bm: int
) -> tuple[torch.Tensor, torch.Tensor, int]:
    """(tile -> sequence [grid], cumulative tiles per sequence [B+1], grid) without a host sync."""
    num_seqs = cu_seqlens.shape[0] - 1
    lens = cu_seqlens[1:] - cu_seqlens[:-1]
    cu_tiles = torch.zeros(num_seqs + 1, dtype=torch.int32, device=cu_seqlens.device)
    torch.cumsum((lens + bm - 1) // bm, 0, out=cu_tiles[1:])
    # Each sequence wastes at most one partial tile, so this bounds the tile count.
    grid = triton.cdiv(num_tokens, bm) + num_seqs
    tiles = torch.arange(grid, dtype=torch.int32, device=cu_seqlens.device)
    tile_seq = torch.searchsorted(cu_tiles, tiles, right=True).sub_(1).clamp_(0, num_seqs - 1)
    return tile_seq.to(torch.int32), cu_tiles, grid


def _cached_tile_map(
    cu_seqlens: torch.Tensor,
    num_tokens: int,
    bm: int,
    index_cache: IndexCache | None,
    rows_per_token: int = 1,
) -> tuple[torch.Tensor, torch.Tensor, int]:
    """`_tile_map` over rows_per_token rows a token (the heads of a packed tile), shared through
    ``index_cache``."""
    grid = triton.cdiv(num_tokens * rows_per_token, bm) + cu_seqlens.shape[0] - 1

    def build() -> tuple[torch.Tensor, torch.Tensor]:
        row_offsets = cu_seqlens if rows_per_token == 1 else cu_seqlens * rows_per_token
        return _tile_map(row_offsets, num_tokens * rows_per_token, bm)[:2]

    key = f"paged_attention_prefill:BM={bm}:rows={rows_per_token}"
    tile_seq, cu_tiles = cached_index_tables(index_cache, key, cu_seqlens, grid, build)
    return tile_seq, cu_tiles, grid


def launch_prefill(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    cu_seqlens: torch.Tensor,
    cached_lens: torch.Tensor,
    block_tables: torch.Tensor,
    scale: float,
    gate: torch.Tensor | None,
    config: PrefillConfig,
    *,
    index_cache: dict[str, tuple[torch.Tensor, ...]] | None = None,
) -> torch.Tensor:
    """paged_attention_prefill with explicit tiles and kernel (the benchmark sweeps them)."""
    _check(q, k_cache, v_cache, cu_seqlens, cached_lens, block_tables, gate)
    o = torch.empty(q.shape, dtype=q.dtype, device=q.device)
    num_seqs, (num_tokens, num_heads, d) = cu_seqlens.shape[0] - 1, q.shape
    if num_tokens == 0 or num_seqs == 0:
        return o
    use_tma = config.use_tma and tma_layout_error(q, k_cache, v_cache, gate, config) is None
    rows_per_token = num_heads // k_cache.shape[2] if use_tma and config.pack_gqa else 1
    tile_seq, cu_tiles, grid = _cached_tile_map(
        cu_seqlens, num_tokens, config.BM, index_cache, rows_per_token
    )
    if use_tma:
        launch_prefill_tma(
            o, q, k_cache, v_cache, gate=gate, index=(cu_seqlens, cached_lens, block_tables),
            tile_map=(tile_seq, cu_tiles, grid), qk_scale=scale * LOG2E, config=config,
        )  # fmt: skip
        return o
    g = gate if gate is not None else q
    _prefill_kernel[(grid, num_heads)](
        q, k_cache, v_cache, g, o,
        cu_seqlens, cached_lens, block_tables, tile_seq, cu_tiles,
        scale * LOG2E,
        q.stride(0), q.stride(1), g.stride(0), g.stride(1), o.stride(0), o.stride(1),
        k_cache.stride(0), k_cache.stride(1), k_cache.stride(2),
        v_cache.stride(0), v_cache.stride(1), v_cache.stride(2), block_tables.stride(0),
        GROUP=num_heads // k_cache.shape[2], BLOCK_SIZE=k_cache.shape[1], D=d,
        BD=dot_tile(d), BM=config.BM, BN=config.BN, HAS_GATE=gate is not None,
        DOT_DTYPE=dot_dtype(q), num_warps=config.num_warps, num_stages=config.num_stages,
    )  # fmt: skip
    return o


def paged_attention_prefill(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    *,
    cu_seqlens: torch.Tensor,
    cached_lens: torch.Tensor,
    block_tables: torch.Tensor,
    scale: float,
    gate: torch.Tensor | None = None,
    index_cache: dict[str, tuple[torch.Tensor, ...]] | None = None,
) -> torch.Tensor:
    """Causal attention of a packed batch of new tokens over a paged KV cache.

    The new tokens' K and V must already be in the cache (see `write_kv_cache`). Token i of
    sequence b sits at absolute position cached_lens[b] + i and attends to cache positions
    0..cached_lens[b] + i of that sequence. Query head h reads KV head h // (H // HKV).

    Args:
        q: [T, H, D] queries (any token/head strides, unit last stride).
        k_cache, v_cache: [num_blocks, block_size, HKV, D], q's dtype, block_size a power of two
            >= 16.
        cu_seqlens: [B+1] int32 contiguous offsets of each sequence's new tokens.
        cached_lens: [B] int32 contiguous, tokens cached before this step.
        block_tables: [B, max_blocks] int32 cache blocks of each sequence, in order (unit last
            stride).
        scale: softmax scale, usually D ** -0.5.
        gate: optional [T, H, D]; the output is multiplied by sigmoid(gate).
        index_cache: optional dict shared by the calls of one step over the same ``cu_seqlens``
            tensor (e.g. every layer of a forward): the query-tile map derived from cu_seqlens is
            built by the first call, stored there and reused by the others (keyed by tile size,
            checked against cu_seqlens and T). Rewriting cu_seqlens in place needs a fresh dict.

    Returns:
        o: [T, H, D] contiguous in q.dtype (softmax and accumulation in fp32).
    """
    config = default_prefill_config(q, k_cache.shape[2])
    return launch_prefill(
        q, k_cache, v_cache, cu_seqlens, cached_lens, block_tables, scale, gate, config,
        index_cache=index_cache,
    )  # fmt: skip
