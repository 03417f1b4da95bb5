"""Batch-invariant linear layers on the GPU: one reduction order per (phase, N, K).

cuBLAS, and the measured dispatch table, choose a kernel by row count, so a row's bits change with
the batch it shares. Inside `batch_invariant(phase)` every CUDA `linear` instead runs a kernel
whose order of summation over K depends only on the phase and the weight's shape:

- "decode": the skinny GEMM. Per weight one K plan (BK, split-K slices and SWAP_AB, from the
  table's tile for the widest measured batch: decode batches are the costly ones), summed in a
  fixed order; per row range (16, 32 or 64 rows, `decode_tile_rows`) the tile the table measured
  for that range where it shares the K plan, else the plan's own tile, in that range's row
  tile. Tiles that differ only in rows, columns, warps, stages and descriptor loads sum each of
  a row's products over the same K slices, BK steps and MMA k-steps, so a row's bits do not
  depend on which range its batch fell in (GPU test `test_decode_tiles_give_a_row_the_same_bits`
  checks every tile the dispatch can pick at every row count from 1 to 256).
- "prefill": the tiled GEMM with one fixed tile per dtype (tensor descriptors for 16-bit
  operands on Hopper), no split-K.

A request's rows always run in the same phase (prompt rows in prefill forwards, generated rows in
decode forwards), so its logits do not depend on what else is scheduled with it.
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Iterator
from contextvars import ContextVar
from functools import lru_cache
from typing import Literal

import torch
import triton
from sparkinfer.kernels.linear.shape_table import ShapeTable, current_table
from sparkinfer.kernels.linear.skinny_gemm import SkinnyGemmConfig, skinny_gemm, split_k_slices
from sparkinfer.kernels.linear.tiled_gemm import TiledGemmConfig, tiled_gemm

Phase = Literal["decode", "prefill"]

DECODE_BM = 16  # rows of a decode tile for one to 16 rows, and for fp32 at any M
# Row tiles for 16-bit decode batches: the smallest holding M rows, the last beyond. A larger
# tile reads each weight tile fewer times, so large batches run faster in 64-row tiles
# (`sparkinfer.lab.kernels.linear_invariant --decode-tile-rows 32,64`; docs/benchmarks.md).
DECODE_TILE_ROWS = (16, 32, 64)
# The fastest over the model's prefill projections of the tiles swept by
# `sparkinfer.lab.kernels.linear_invariant --sweep` (the descriptor tile on 4 warps; its time
# against the pointer tile and cuBLAS is in docs/benchmarks.md).
PREFILL_CONFIG = TiledGemmConfig(num_warps=4, TMA=True)
PREFILL_CONFIG_FP32 = TiledGemmConfig(BK=32)  # the same pipeline in shared memory
_TARGET_PROGRAMS = 256  # about two waves over a Hopper GPU's multiprocessors

_PHASE: ContextVar[Phase | None] = ContextVar("sparkinfer_linear_phase", default=None)


@contextlib.contextmanager
def batch_invariant(phase: Phase) -> Iterator[None]:
    """CUDA `linear` calls inside run the batch-invariant kernel of `phase`."""
    if phase not in ("decode", "prefill"):
        raise ValueError(f"batch_invariant: phase is {phase!r}; expected 'decode' or 'prefill'")
    token = _PHASE.set(phase)
    try:
        yield
    finally:
        _PHASE.reset(token)


def current_phase() -> Phase | None:
    """The phase set by the innermost `batch_invariant`, or None outside one."""
    return _PHASE.get()


def decode_config(
    n: int, k: int, dtype: torch.dtype = torch.bfloat16, tile_rows: int = DECODE_BM
) -> SkinnyGemmConfig:
    """The skinny-GEMM config a decode batch in `tile_rows`-row tiles uses for an [N, K] weight
    (see `decode_tile_rows`; programs of one column block over several row tiles run side by side
    and share its weight tiles in L2).

    Every `tile_rows` gets the same K plan (`decode_k_plan`); the columns, warps, stages and
    descriptor loads are the table's for that row range where its tile shares the plan.
    """
    return _decode_config(current_table(), n, k, dtype, tile_rows)


def decode_k_plan(n: int, k: int, dtype: torch.dtype = torch.bfloat16) -> tuple[int, int, bool]:
    """(BK, K slices, SWAP_AB) of every decode tile of an [N, K] weight: what fixes the order in
    which a row's products are summed."""
    plan = _plan_tile(current_table(), n, k, dtype)
    return plan.BK, split_k_slices(k, plan)[0], plan.SWAP_AB


@lru_cache(maxsize=512)
def _decode_config(
    table: ShapeTable, n: int, k: int, dtype: torch.dtype, tile_rows: int
) -> SkinnyGemmConfig:
    plan = _plan_tile(table, n, k, dtype)
    measured = table.lookup(tile_rows, n, k, dtype) if tile_rows in DECODE_TILE_ROWS else None
    if measured is not None and _k_plan(measured, k) == _k_plan(plan, k):
        return dataclasses.replace(measured, BM=tile_rows)
    return dataclasses.replace(plan, BM=tile_rows)


@lru_cache(maxsize=256)
def _plan_tile(table: ShapeTable, n: int, k: int, dtype: torch.dtype) -> SkinnyGemmConfig:
    """The tile whose K plan every decode batch of an [N, K] weight keeps: the table's Triton tile
    for the widest row range it measured one, else its one-row tile, else the widest column
    block that still gives ~256 programs, no split."""
    for rows in reversed(DECODE_TILE_ROWS):
        measured = table.lookup(rows, n, k, dtype)
        if measured is not None:
            return measured
    measured = table.decode_entry(n, k, dtype)
    if measured is not None:
        return measured
    bn = next((b for b in (64, 32) if triton.cdiv(n, b) >= _TARGET_PROGRAMS * 3 // 4), 16)
    return SkinnyGemmConfig(BN=bn, BK=128, SPLIT_K=1, num_stages=4)


def _k_plan(config: SkinnyGemmConfig, k: int) -> tuple[int, int, bool]:
    return config.BK, split_k_slices(k, config)[0], config.SWAP_AB


def decode_tile_rows(num_rows: int, dtype: torch.dtype) -> int:
    """Rows of a decode tile for a batch of `num_rows`: the smallest of DECODE_TILE_ROWS holding
    them (the largest beyond) for 16-bit inputs, DECODE_BM for fp32 (its tf32 MMAs were not
    checked across tile sizes)."""
    if dtype == torch.float32:
        return DECODE_BM
    return next((b for b in DECODE_TILE_ROWS if num_rows <= b), DECODE_TILE_ROWS[-1])


def invariant_linear(x: torch.Tensor, weight: torch.Tensor, phase: Phase) -> torch.Tensor:
    """y = x @ weight.T whose rows do not depend on M: the kernel of `phase` for this shape."""
    if phase == "decode":
        rows = decode_tile_rows(x.shape[0], x.dtype)
        config = decode_config(weight.shape[0], weight.shape[1], x.dtype, rows)
        return skinny_gemm(x, weight, config)
    return tiled_gemm(
        x, weight, PREFILL_CONFIG_FP32 if x.dtype == torch.float32 else PREFILL_CONFIG
    )
