"""The batch-invariant FP8 kernels: what `fp8_linear` runs inside `linear.batch_invariant(phase)`.

A row's bits must not depend on how many rows share its launch nor where it sits (so a
speculative verify row and a plain decode row of the same token agree). Each kernel here sums a
row's products in an order fixed by the phase and the weight's shape alone:

- "decode": the swap-AB GEMM (`swap_ab.py`, e4m3 tensor-core dots streaming the weight), with the
  K plan (SPLIT_K slices of whole 128-column steps, summed in slice order) of the tile table's
  one-row tile for every M. The row tile (`DECODE_ROW_TILES`: 16, 32 or 64 rows, the smallest
  holding M; 64-row tiles beyond) and whether x is quantized before the launch or in registers
  follow the table: neither changes a row's sums (each row's e4m3 values and scale come from
  that row alone, by the same rounding either way; a row's dot runs the same MMA k-steps
  whatever the tile's width; GPU tests `test_swap_ab_row_tiles_and_quantizers_give_a_row_the_
  same_bits_on_gpu`, `test_invariant_rows_do_not_depend_on_the_batch_on_gpu`). x is quantized
  per token and 128-column group, as on the default route to 32 rows (the decode GEMM this
  replaced read bf16 x).
- "prefill": the prompt GEMM with one fixed tile (`INVARIANT_PROMPT_CONFIG`), no split-K, x
  quantized per row and group.

cuBLAS picks its algorithm by shape, so it is never taken here.
"""

from __future__ import annotations

import dataclasses

import torch
from sparkinfer.kernels.fp8_linear.prompt import Fp8PromptConfig, fp8_gemm_prompt
from sparkinfer.kernels.fp8_linear.ref import Fp8Activation
from sparkinfer.kernels.fp8_linear.routes import DECODE_MAX_ROWS
from sparkinfer.kernels.fp8_linear.swap_ab import Fp8SwapAbConfig, fp8_gemm_swap_ab
from sparkinfer.kernels.fp8_linear.tiles import swap_ab_tile
from sparkinfer.kernels.linear.invariant import Phase

# The prefill tile: e4m3 tiles through tensor descriptors, each step's scales folded into one
# per row (FOLD_SCALES), one program per SM walking the tiles (PERSISTENT). The fastest of
# `sparkinfer.lab.kernels.fp8_prompt_tune` on the H200: 930 TFLOP/s over the five 27B
# projections at 4,096 rows (1.32x bf16's batch-invariant GEMM; the pointer tile it replaced
# made 650), 746 at 512.
INVARIANT_PROMPT_CONFIG = Fp8PromptConfig(num_stages=4, TMA=True, FOLD_SCALES=True, PERSISTENT=True)


# Rows of x per decode program: the smallest tile holding the batch, the last beyond (64-row
# tiles of one weight tile run side by side and share it in L2). The swap-AB route's own tiles;
# (16,) would keep one MMA width for every batch.
DECODE_ROW_TILES = (16, 32, 64)


def decode_row_tile_for(m: int) -> int:
    """Rows of x per program for a decode batch of M rows (`DECODE_ROW_TILES`)."""
    return next((b for b in DECODE_ROW_TILES if m <= b), DECODE_ROW_TILES[-1])


def invariant_swap_ab_tile(m: int, n: int, k: int) -> Fp8SwapAbConfig:
    """The swap-AB tile of a decode batch of M rows against an [N, K] weight: the table's tile
    for min(M, 64) rows in its row tile, with the one-row tile's K plan (the same for every M)."""
    plan = swap_ab_tile(1, n, k)
    tile = swap_ab_tile(min(m, DECODE_MAX_ROWS), n, k)
    return dataclasses.replace(tile, BM=decode_row_tile_for(m), SPLIT_K=plan.SPLIT_K)


def invariant_fp8_linear(
    x: torch.Tensor,
    weight: torch.Tensor,
    weight_scale_inv: torch.Tensor,
    phase: Phase,
    *,
    x_fp8: Fp8Activation | None = None,
) -> torch.Tensor:
    """y = x @ W.T whose rows do not depend on M: the FP8 kernel of `phase` for this shape.

    Args:
        x: [M, K] activations (bf16, fp16 or fp32), unit stride along K.
        weight: [N, K] float8_e4m3fn, contiguous.
        weight_scale_inv: [ceil(N/128), ceil(K/128)] (or [N, ceil(K/128)]) fp32 scales.
        phase: "decode" (the swap-AB GEMM) or "prefill" (the prompt GEMM).
        x_fp8: x already quantized per token and group (the norm before the linear gives it):
            read instead of quantizing x (the same bits).

    Returns:
        y: [M, N] in x.dtype (the specification is `fp8_linear_prompt_ref`).
    """
    if phase == "decode":
        (m, k), n = x.shape, weight.shape[0]
        tile = invariant_swap_ab_tile(m, n, k)
        return fp8_gemm_swap_ab(x, weight, weight_scale_inv, tile, x_fp8=x_fp8)
    return fp8_gemm_prompt(x, weight, weight_scale_inv, INVARIANT_PROMPT_CONFIG, x_fp8=x_fp8)
