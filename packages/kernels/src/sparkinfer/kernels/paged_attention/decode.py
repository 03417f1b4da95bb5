"""Split-KV (flash-decoding) attention of one new token per sequence over a paged KV cache.

Pass 1: program (b, kv head, split) reads one slice of the context once for all GROUP query heads
of that KV head (packed as rows of one tile) and writes a normalised partial output with its
softmax max and sum. Pass 2: program (b, head, column slice) loads every split's partial of its
columns at once, merges them in fp32 by a fixed reduction tree and applies the sigmoid gate.

Split plan: a context of len keys is cut into min(MAX_SPLITS, ceil(len / MIN_SPLIT_LEN)) slices
of whole BN-key tiles, a function of the length and the launch's constants alone (no host sync,
so a CUDA graph captures it).

- Inside a `batch_invariant` phase MIN_SPLIT_LEN is the config's (256 on CUDA) whatever the
  batch, so a sequence's output is bit-identical whatever else shares the batch.
- Otherwise (the default mode) every tile may start a split (MIN_SPLIT_LEN = BN) and MAX_SPLITS
  is chosen from the batch size and the KV-head count (`choose_max_splits`): the power of two
  nearest PROGRAMS_PER_SM * multiprocessors / (num_seqs * HKV), at most the config's 64. A
  context of at least BN * MAX_SPLITS keys then runs about two programs an SM whatever its
  length. Fewer, longer splits write fewer fp32 partials for the merge to read; half as
  many splits again (one program an SM) ran slower at every batch size tried. A row's output
  then depends on the batch size (a CUDA graph bucket), through the split plan only. It
  streams contexts faster than a plan of at least four programs an SM in splits of at most 256
  keys (the kernel records, docs/benchmarks.md).

Tile loads: with `DecodeConfig.use_tma` (the CUDA default for the 64-key tiles) a BN-key tile,
which lies inside one cache block, is one tensor-descriptor box of the caches viewed as
[blocks * block_size, HKV * D]; V rows past the context are zeroed after the load, as the
pointer loads' masks do, so a stale NaN in the block's tail never meets p = 0. The outputs are
the pointer loads' bits; descriptors stream the 64-key tiles faster (docs/benchmarks.md).
"""

# Triton's annotations misread valid kernel code: constexpr arguments and branches,
# num_warps/num_stages.
# pyright: reportArgumentType=false, reportCallIssue=false, reportOperatorIssue=false
# pyright: reportPossiblyUnboundVariable=false

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import NamedTuple

import torch
import triton
import triton.language as tl
from sparkinfer.kernels._triton import (
    check_device,
    dot_dtype,
    dot_precision,
    dot_tile,
    num_multiprocessors,
    tma_device_error,
)
from sparkinfer.kernels.dependent_launch import dependent_launch, wait_for_prior_kernels
from sparkinfer.kernels.linear.invariant import current_phase
from sparkinfer.kernels.paged_attention.checks import (
    check_block_tables,
    check_cache,
    check_heads,
    check_index,
)
from sparkinfer.kernels.paged_attention.prefill_tma import cache_layout_error, kv_row
from triton.tools.tensor_descriptor import TensorDescriptor

LOG2E = 1.4426950408889634
# Split programs per multiprocessor that the default mode's grid aims for over a long context.
PROGRAMS_PER_SM = 2
# Partials one merge program loads at once: 64 splits x 64 columns, 16 KiB of fp32 on 4 warps.
# Faster than loading 16 splits x the whole D at a time, looped (the kernel records,
# docs/benchmarks.md).
MERGE_TILE_ELEMENTS = 4096


@dataclass(frozen=True)
class DecodeConfig:
    """Split plan and tiles: a context is cut into min(MAX_SPLITS, ceil(len / MIN_SPLIT_LEN))
    slices of whole BN-key tiles."""

    BN: int = 64
    MIN_SPLIT_LEN: int = 256
    MAX_SPLITS: int = 64
    num_warps: int = 4
    num_stages: int = 2
    use_tma: bool = False  # K and V tiles through tensor descriptors where the layout allows


@triton.jit
def _split_plan(ctx_len, BN: tl.constexpr, MIN_SPLIT_LEN: tl.constexpr, MAX_SPLITS: tl.constexpr):
    """(number of splits, keys per split) for one context: a function of its length only."""
    ctx_len = tl.maximum(ctx_len, 1)  # padding rows (length 0) get a harmless one-split plan
    num_splits = tl.minimum(tl.cdiv(ctx_len, MIN_SPLIT_LEN), MAX_SPLITS)
    num_splits = tl.maximum(num_splits, 1)
    split_len = tl.cdiv(tl.cdiv(ctx_len, num_splits), BN) * BN
    return tl.cdiv(ctx_len, split_len), split_len


@triton.jit
def _decode_split_kernel(
    p_q, p_k, p_v, desc_k, desc_v, p_ctx, p_bt, p_part_o, p_part_ml,
    qk_scale,
    stride_qb, stride_qh, stride_kb, stride_ks, stride_kh, stride_vb, stride_vs, stride_vh,
    stride_btb,
    GROUP: tl.constexpr, BG: tl.constexpr, BLOCK_SIZE: tl.constexpr, D: tl.constexpr,
    BD: tl.constexpr, BN: tl.constexpr, MIN_SPLIT_LEN: tl.constexpr, MAX_SPLITS: tl.constexpr,
    TMA: tl.constexpr, DOT_DTYPE: tl.constexpr, DOT_PRECISION: tl.constexpr,
    USE_PDL: tl.constexpr,
):  # fmt: skip
    wait_for_prior_kernels(USE_PDL)
    i_b, i_kvh, i_s = tl.program_id(0).to(tl.int64), tl.program_id(1).to(tl.int64), tl.program_id(2)
    ctx_len = tl.load(p_ctx + i_b)
    num_splits, split_len = _split_plan(ctx_len, BN, MIN_SPLIT_LEN, MAX_SPLITS)
    if i_s >= num_splits or ctx_len <= 0:
        return
    n_start = i_s * split_len
    n_end = tl.minimum(n_start + split_len, ctx_len)

    o_g = tl.arange(0, BG)
    o_d = tl.arange(0, BD)
    m_d = o_d < D
    o_h = i_kvh * GROUP + o_g  # query heads of this KV head, [BG]
    m_gd = (o_g < GROUP)[:, None] & m_d[None, :]
    b_q = tl.load(p_q + i_b * stride_qb + o_h[:, None] * stride_qh + o_d[None, :], mask=m_gd,
                  other=0.0).to(DOT_DTYPE)  # fmt: skip
    p_bt += i_b * stride_btb
    b_acc = tl.zeros((BG, BD), dtype=tl.float32)
    b_m = tl.full((BG,), float("-inf"), dtype=tl.float32)
    b_l = tl.zeros((BG,), dtype=tl.float32)
    col = (i_kvh * D).to(tl.int32)  # the KV head's columns in the descriptors' [rows, HKV * D]
    for n0 in range(n_start, n_end, BN):
        o_n = n0 + tl.arange(0, BN)
        m_n = o_n < n_end
        if TMA:  # a BN-key tile lies inside one cache block: one descriptor box
            row = kv_row(p_bt, n0, BLOCK_SIZE)
            b_k = desc_k.load([row, col])
        else:
            b_blk = tl.load(p_bt + o_n // BLOCK_SIZE, mask=m_n, other=0).to(tl.int64)
            o_row = o_n % BLOCK_SIZE
            m_kv = m_n[:, None] & m_d[None, :]
            o_k = b_blk * stride_kb + o_row * stride_ks + i_kvh * stride_kh
            b_k = tl.load(p_k + o_k[:, None] + o_d[None, :], mask=m_kv, other=0.0)
        b_s = tl.dot(b_q, tl.trans(b_k.to(DOT_DTYPE)), input_precision=DOT_PRECISION)
        b_s = b_s * qk_scale  # [BG, BN], log2 domain
        b_s = tl.where(m_n[None, :], b_s, float("-inf"))
        b_m_new = tl.maximum(b_m, tl.max(b_s, axis=1))
        b_p = tl.exp2(b_s - b_m_new[:, None])
        b_alpha = tl.exp2(b_m - b_m_new)
        b_l = b_l * b_alpha + tl.sum(b_p, axis=1)
        if TMA:  # rows past the context are stale cache rows: zero, so p = 0 cannot meet NaN
            b_v = tl.where(m_n[:, None], desc_v.load([row, col]), 0.0)
        else:
            o_v = b_blk * stride_vb + o_row * stride_vs + i_kvh * stride_vh
            b_v = tl.load(p_v + o_v[:, None] + o_d[None, :], mask=m_kv, other=0.0)
        b_acc = tl.dot(
            b_p.to(DOT_DTYPE),
            b_v.to(DOT_DTYPE),
            b_acc * b_alpha[:, None],
            input_precision=DOT_PRECISION,
        )
        b_m = b_m_new

    # Partials: o [B, H, MAX_SPLITS, BD] normalised, (m, l) [B, H, MAX_SPLITS, 2] fp32.
    num_heads = tl.num_programs(1) * GROUP
    o_part = (i_b * num_heads + o_h) * MAX_SPLITS + i_s  # [BG]
    m_g = o_g < GROUP
    tl.store(p_part_o + o_part[:, None] * BD + o_d[None, :], b_acc / b_l[:, None],
             mask=m_g[:, None])  # fmt: skip
    tl.store(p_part_ml + o_part * 2, b_m, mask=m_g)
    tl.store(p_part_ml + o_part * 2 + 1, b_l, mask=m_g)


@triton.jit
def _decode_merge_kernel(
    p_part_o, p_part_ml, p_ctx, p_gate, p_o,
    stride_gb, stride_gh, stride_ob, stride_oh,
    D: tl.constexpr, BD: tl.constexpr, BN: tl.constexpr, MIN_SPLIT_LEN: tl.constexpr,
    MAX_SPLITS: tl.constexpr, DC: tl.constexpr, HAS_GATE: tl.constexpr, USE_PDL: tl.constexpr,
):  # fmt: skip
    """o[b, h, DC columns] = the splits' partial outputs weighted by their softmax sums.

    Every split's partial is one load of a [MAX_SPLITS, DC] tile, reduced by a fixed tree: the
    sum depends on the split plan alone, never on the launch order or the batch.
    """
    i_b, i_h = tl.program_id(0).to(tl.int64), tl.program_id(1).to(tl.int64)
    num_heads = tl.num_programs(1)
    o_d = tl.program_id(2) * DC + tl.arange(0, DC)
    m_d = o_d < D
    # Read before the wait: the split kernel, the one ahead, writes neither the lengths nor the
    # gate, and every kernel before it has finished once this one launches.
    ctx_len = tl.load(p_ctx + i_b)
    if HAS_GATE:
        b_g = tl.load(p_gate + i_b * stride_gb + i_h * stride_gh + o_d, mask=m_d, other=0.0)
    wait_for_prior_kernels(USE_PDL)
    p_o += i_b * stride_ob + i_h * stride_oh + o_d
    if ctx_len <= 0:
        tl.store(p_o, tl.zeros((DC,), dtype=tl.float32).to(p_o.dtype.element_ty), mask=m_d)
        return
    num_splits, _ = _split_plan(ctx_len, BN, MIN_SPLIT_LEN, MAX_SPLITS)
    o_s = tl.arange(0, MAX_SPLITS)
    m_s = o_s < num_splits
    o_part = (i_b * num_heads + i_h) * MAX_SPLITS + o_s
    b_ms = tl.load(p_part_ml + o_part * 2, mask=m_s, other=float("-inf"))
    b_ls = tl.load(p_part_ml + o_part * 2 + 1, mask=m_s, other=0.0)
    b_parts = tl.load(p_part_o + o_part[:, None] * BD + o_d[None, :],
                      mask=m_s[:, None] & m_d[None, :], other=0.0)  # fmt: skip
    b_w = tl.exp2(b_ms - tl.max(b_ms, axis=0)) * b_ls
    b_acc = tl.sum((b_w / tl.sum(b_w, axis=0))[:, None] * b_parts, axis=0)
    if HAS_GATE:
        b_acc = b_acc * tl.sigmoid(b_g.to(tl.float32))
    tl.store(p_o, b_acc.to(p_o.dtype.element_ty), mask=m_d)


class SplitTiles(NamedTuple):
    """Pass 1's tiles along its dots: BG query heads of one KV head, BD head-dim columns."""

    BG: int
    BD: int


def split_tiles(num_heads: int, num_kv_heads: int, d: int) -> SplitTiles:
    """Pass 1's tiles for H query heads over HKV KV heads of D dims: each at least MIN_DOT_TILE,
    so any group (a block drafter packs its block rows x H / HKV query heads into one) and any
    head dim give valid tl.dot shapes."""
    return SplitTiles(BG=dot_tile(num_heads // num_kv_heads), BD=dot_tile(d))


def merge_columns(bd: int, max_splits: int) -> int:
    """Output columns per merge program: a [max_splits, columns] fp32 tile of at most
    MERGE_TILE_ELEMENTS, so a merge program loads its splits at once and a head's D spreads
    over several programs."""
    return max(1, min(bd, MERGE_TILE_ELEMENTS // max_splits))


def choose_max_splits(num_seqs: int, num_kv_heads: int, num_sms: int, config: DecodeConfig) -> int:
    """MAX_SPLITS of the default mode for a batch (see the module docstring): the power of two
    nearest PROGRAMS_PER_SM * num_sms / (num_seqs * num_kv_heads) in log scale, between 1 and
    config.MAX_SPLITS."""
    wanted = PROGRAMS_PER_SM * num_sms / max(num_seqs * num_kv_heads, 1)
    if wanted <= 1:
        return 1
    return min(config.MAX_SPLITS, 2 ** round(math.log2(wanted)))


def default_decode_config(q: torch.Tensor, num_kv_heads: int) -> DecodeConfig:
    """Tiles measured on CUDA (docs/benchmarks.md), small tiles and splits for the CPU
    interpreter; outside a batch-invariant phase the split plan is chosen for q's batch size
    (`choose_max_splits`)."""
    if q.is_cuda:
        config = DecodeConfig(use_tma=True)
    else:
        config = DecodeConfig(BN=16, MIN_SPLIT_LEN=32, MAX_SPLITS=8, num_warps=4, num_stages=1)
    if current_phase() is not None:
        return config
    max_splits = choose_max_splits(q.shape[0], num_kv_heads, num_multiprocessors(q.device), config)
    return dataclasses.replace(config, MIN_SPLIT_LEN=config.BN, MAX_SPLITS=max_splits)


def _check(q, k_cache, v_cache, context_lens, block_tables, gate) -> None:
    op = "paged_attention_decode"
    tensors = {"q": q, "k_cache": k_cache, "v_cache": v_cache, "context_lens": context_lens,
               "block_tables": block_tables}  # fmt: skip
    if gate is not None:
        tensors["gate"] = gate
    check_device(op, tensors)
    check_cache(op, k_cache, v_cache)
    check_heads(op, "q", q, None, k_cache)
    num_seqs = q.shape[0]
    if gate is not None:
        check_heads(op, "gate", gate, num_seqs, k_cache)
        if gate.shape != q.shape:
            raise ValueError(f"{op}: gate has shape {list(gate.shape)}; expected {list(q.shape)}")
    check_index(op, "context_lens", context_lens, (num_seqs,))
    check_block_tables(op, block_tables, num_seqs)


def launch_decode(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    context_lens: torch.Tensor,
    block_tables: torch.Tensor,
    scale: float,
    gate: torch.Tensor | None,
    config: DecodeConfig,
) -> torch.Tensor:
    """paged_attention_decode with an explicit split plan and tiles (the benchmark sweeps them)."""
    _check(q, k_cache, v_cache, context_lens, block_tables, gate)
    return _launch(q, k_cache, v_cache, context_lens, block_tables, scale, gate, config)


def _launch(q, k_cache, v_cache, context_lens, block_tables, scale, gate, config) -> torch.Tensor:
    o = torch.empty(q.shape, dtype=q.dtype, device=q.device)
    if q.shape[0] == 0:
        return o
    parts = launch_decode_splits(q, k_cache, v_cache, context_lens, block_tables, scale, config)
    launch_decode_merge(parts, context_lens, gate, o, config)
    return o


class SplitPartials(NamedTuple):
    """Pass 1's output: o [B, H, MAX_SPLITS, BD] normalised, ml [B, H, MAX_SPLITS, 2] (max, sum),
    both fp32."""

    o: torch.Tensor
    ml: torch.Tensor


def launch_decode_splits(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    context_lens: torch.Tensor,
    block_tables: torch.Tensor,
    scale: float,
    config: DecodeConfig,
) -> SplitPartials:
    """Pass 1 alone, unchecked (`launch_decode` checks): every split's partial output."""
    num_seqs, num_heads, d = q.shape
    hkv = k_cache.shape[2]
    tiles = split_tiles(num_heads, hkv, d)
    bd = tiles.BD
    part_o = torch.empty((num_seqs, num_heads, config.MAX_SPLITS, bd), dtype=torch.float32,
                         device=q.device)  # fmt: skip
    part_ml = torch.empty((num_seqs, num_heads, config.MAX_SPLITS, 2), dtype=torch.float32,
                          device=q.device)  # fmt: skip
    group = num_heads // hkv
    use_tma = (config.use_tma and tma_device_error(q) is None
               and cache_layout_error(k_cache, v_cache, config.BN) is None)  # fmt: skip
    # (a descriptor box is D wide: cache_layout_error keeps D >= MIN_DOT_TILE, so BD == D)
    desc_k, desc_v = k_cache, v_cache  # not read without TMA
    if use_tma:
        rows = k_cache.shape[0] * k_cache.shape[1]
        desc_k, desc_v = (TensorDescriptor(c, [rows, hkv * d], [c.stride(1), 1], [config.BN, d])
                          for c in (k_cache, v_cache))  # fmt: skip
    pdl = dependent_launch(q)
    _decode_split_kernel[(num_seqs, hkv, config.MAX_SPLITS)](
        q, k_cache, v_cache, desc_k, desc_v, context_lens, block_tables, part_o, part_ml,
        scale * LOG2E,
        q.stride(0), q.stride(1), *k_cache.stride()[:3], *v_cache.stride()[:3],
        block_tables.stride(0),
        GROUP=group, BG=tiles.BG, BLOCK_SIZE=k_cache.shape[1], D=d,
        BD=bd, BN=config.BN, MIN_SPLIT_LEN=config.MIN_SPLIT_LEN, MAX_SPLITS=config.MAX_SPLITS,
        TMA=use_tma, DOT_DTYPE=dot_dtype(q), DOT_PRECISION=dot_precision(q), USE_PDL=pdl,
        num_warps=config.num_warps, num_stages=config.num_stages, launch_pdl=pdl,
    )  # fmt: skip
    return SplitPartials(part_o, part_ml)


def launch_decode_merge(
    parts: SplitPartials,
    context_lens: torch.Tensor,
    gate: torch.Tensor | None,
    o: torch.Tensor,
    config: DecodeConfig,
) -> None:
    """Pass 2 alone, unchecked: o [B, H, D] (written) from pass 1's partials of the same config.

    Under dependent launch it reads context_lens and gate before waiting on the kernel launched
    just before it, so that kernel must write neither (pass 1 does not)."""
    num_seqs, num_heads, d = o.shape
    bd = parts.o.shape[-1]
    g = gate if gate is not None else o
    dc = merge_columns(bd, config.MAX_SPLITS)
    pdl = dependent_launch(o)
    _decode_merge_kernel[(num_seqs, num_heads, bd // dc)](
        parts.o, parts.ml, context_lens, g, o,
        g.stride(0), g.stride(1), o.stride(0), o.stride(1),
        D=d, BD=bd, BN=config.BN, MIN_SPLIT_LEN=config.MIN_SPLIT_LEN,
        MAX_SPLITS=config.MAX_SPLITS, DC=dc, HAS_GATE=gate is not None, USE_PDL=pdl,
        num_warps=4, launch_pdl=pdl,
    )  # fmt: skip


def paged_attention_decode(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    *,
    context_lens: torch.Tensor,
    block_tables: torch.Tensor,
    scale: float,
    gate: torch.Tensor | None = None,
) -> torch.Tensor:
    """Attention of one new token per sequence over its first context_lens[b] cached positions.

    The new token's K and V must already be in the cache. A row with context_lens[b] == 0 is
    padding and its output is zero. Inside `batch_invariant("decode")` a sequence's result does
    not depend on the rest of the batch; outside it, it depends on the batch size through the
    split plan only (shorter splits for small batches, see the module docstring).

    Args:
        q: [B, H, D] one query per sequence (any strides, unit last stride).
        k_cache, v_cache: [num_blocks, block_size, HKV, D], q's dtype, block_size a power of two
            >= 16.
        context_lens: [B] int32 contiguous, cached positions to attend to (with the new token).
        block_tables: [B, max_blocks] int32 cache blocks of each sequence, in order (unit last
            stride).
        scale: softmax scale, usually D ** -0.5.
        gate: optional [B, H, D]; the output is multiplied by sigmoid(gate).

    Returns:
        o: [B, H, D] contiguous in q.dtype (softmax and accumulation in fp32).
    """
    _check(q, k_cache, v_cache, context_lens, block_tables, gate)
    config = default_decode_config(q, k_cache.shape[2])
    return _launch(q, k_cache, v_cache, context_lens, block_tables, scale, gate, config)
