"""Prompt-shaped FP8 GEMM on the FP8 tensor cores, DeepSeek-style block scaling.

Activations are quantized per token and per 128-column group (`quantize.quantize_activation_fp8`:
scale = amax / 448, dynamic), then `fp8_gemm_prompt` multiplies e4m3 tiles of x and of the weight
with tl.dot into an fp32 accumulator: each BK = 128 step lies in one activation group and one
weight block, so the step's dot is scaled by x's group scale per row and the weight's block
scale per column before it is added. Under the CPU interpreter the dot runs on fp32 copies of
the e4m3 values (its e4m3 dot is not exact there), which is the same product.

One tile for every M and no split-K, so a row's sums never depend on the batch: the
batch-invariant mode's prefill kernel (`invariant.py`). With TMA (Hopper and later, 16-byte
aligned rows) the e4m3 tiles come through tensor descriptors, which zero-fill past M, N and K:
the same values and sums as the pointer loads; persistent programs (PERSISTENT) sum each tile
the same way too. x already quantized (`x_fp8`, by the norm before the linear) is read instead
of quantizing x again (the same bits).
"""

# Triton's annotations misread valid kernel code: num_warps/num_stages, constexpr arguments,
# tl.range.
# pyright: reportCallIssue=false, reportArgumentType=false, reportGeneralTypeIssues=false

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl
from sparkinfer.kernels._triton import num_multiprocessors, tma_aligned, tma_device_error
from sparkinfer.kernels.fp8_linear._checks import check_fp8_activation, check_fp8_operands
from sparkinfer.kernels.fp8_linear.quantize import quantize_activation_fp8
from sparkinfer.kernels.fp8_linear.ref import BLOCK, Fp8Activation
from triton.tools.tensor_descriptor import TensorDescriptor


@dataclass(frozen=True)
class Fp8PromptConfig:
    """Tiles of one prompt launch: BM x BN outputs per program, GROUP_M row tiles per group; TMA:
    descriptor loads of x and the weight where the device and operands allow; FOLD_SCALES: where
    the BN columns lie in one weight scale block (128x128 blocks, BN dividing 128), x's row scale
    and that block's scale are multiplied first, so each step adds its dot with one FMA per output
    (a different rounding of the same product; off: two multiplies and an add). PERSISTENT: one
    program per SM walks the output tiles in the same grouped order (the same sums per tile; the
    next tile's loads start while this one's store drains), WARP_SPECIALIZE there asking Triton
    for producer and consumer warps (where the installed Triton offers it)."""

    BM: int = 128
    BN: int = 128
    GROUP_M: int = 8
    num_warps: int = 8
    num_stages: int = 3
    TMA: bool = False
    FOLD_SCALES: bool = False
    PERSISTENT: bool = False
    WARP_SPECIALIZE: bool = False


@triton.jit
def _grouped_tile(i_tile, num_m, num_n, GROUP_M: tl.constexpr):
    """(row tile, column tile) of output tile i_tile: GROUP_M row tiles share each column tile
    while it is in L2."""
    group = GROUP_M * num_n
    first_m = (i_tile // group) * GROUP_M
    group_rows = tl.minimum(num_m - first_m, GROUP_M)
    return first_m + (i_tile % group) % group_rows, (i_tile % group) // group_rows


@triton.jit
def _prompt_tile(
    p_x, p_xs, p_w, p_ws, p_y, desc_x, desc_w, i_m, i_n,
    M, N, K, num_k_blocks, stride_xs_k,
    BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr, SCALE_ROWS: tl.constexpr,
    IS_INTERPRETED: tl.constexpr, TMA: tl.constexpr, FOLD_SCALES: tl.constexpr,
):  # fmt: skip
    """One BM x BN output tile: every K step's e4m3 dot, scaled, added in K order; stored."""
    o_m = i_m.to(tl.int64) * BM + tl.arange(0, BM).to(tl.int64)
    o_n = i_n.to(tl.int64) * BN + tl.arange(0, BN).to(tl.int64)
    m_m, m_n = o_m < M, o_n < N
    p_xsm = p_xs + o_m  # x's scales: one group's column contiguous
    p_wsn = p_ws + (o_n // SCALE_ROWS) * num_k_blocks
    p_ws1 = p_ws + (i_n * BN // SCALE_ROWS) * num_k_blocks  # the tile's one block row (FOLD)
    b_acc = tl.zeros((BM, BN), dtype=tl.float32)
    for kb in range(0, num_k_blocks):
        if TMA:
            b_x = desc_x.load([i_m * BM, kb * BK])
            b_w = desc_w.load([i_n * BN, kb * BK])
        else:
            o_k = kb * BK + tl.arange(0, BK).to(tl.int64)
            m_k = o_k < K
            b_x = tl.load(p_x + o_m[:, None] * K + o_k[None, :],
                          mask=m_m[:, None] & m_k[None, :], other=0.0)  # fmt: skip
            b_w = tl.load(p_w + o_n[:, None] * K + o_k[None, :],
                          mask=m_n[:, None] & m_k[None, :], other=0.0)  # fmt: skip
        if IS_INTERPRETED:
            b_dot = tl.dot(b_x.to(tl.float32), tl.trans(b_w.to(tl.float32)))
        else:
            b_dot = tl.dot(b_x, tl.trans(b_w))
        b_xs = tl.load(p_xsm + kb * stride_xs_k, mask=m_m, other=0.0)
        if FOLD_SCALES:  # one weight block per step: one scale per row, one FMA per output
            b_acc += b_dot * (b_xs * tl.load(p_ws1 + kb))[:, None]
        else:
            b_ws = tl.load(p_wsn + kb, mask=m_n, other=0.0)
            b_acc += b_dot * b_xs[:, None] * b_ws[None, :]
    o_y = o_m[:, None] * N + o_n[None, :]
    tl.store(p_y + o_y, b_acc.to(p_y.dtype.element_ty), mask=m_m[:, None] & m_n[None, :])


@triton.jit
def _fp8_prompt_kernel(
    p_x, p_xs, p_w, p_ws, p_y, desc_x, desc_w,
    M, N, K, num_k_blocks, stride_xs_k,
    BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr, GROUP_M: tl.constexpr,
    SCALE_ROWS: tl.constexpr, IS_INTERPRETED: tl.constexpr, TMA: tl.constexpr,
    FOLD_SCALES: tl.constexpr,
):  # fmt: skip
    i_m, i_n = _grouped_tile(tl.program_id(0), tl.cdiv(M, BM), tl.cdiv(N, BN), GROUP_M)
    _prompt_tile(p_x, p_xs, p_w, p_ws, p_y, desc_x, desc_w, i_m, i_n, M, N, K, num_k_blocks,
                 stride_xs_k, BM, BN, BK, SCALE_ROWS, IS_INTERPRETED, TMA, FOLD_SCALES)  # fmt: skip


@triton.jit
def _fp8_prompt_persistent_kernel(
    p_x, p_xs, p_w, p_ws, p_y, desc_x, desc_w,
    M, N, K, num_k_blocks, stride_xs_k,
    BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr, GROUP_M: tl.constexpr,
    SCALE_ROWS: tl.constexpr, IS_INTERPRETED: tl.constexpr, TMA: tl.constexpr,
    FOLD_SCALES: tl.constexpr, NUM_PROGRAMS: tl.constexpr, WARP_SPECIALIZE: tl.constexpr,
):  # fmt: skip
    num_m, num_n = tl.cdiv(M, BM), tl.cdiv(N, BN)
    for i_tile in tl.range(tl.program_id(0), num_m * num_n, NUM_PROGRAMS,
                           warp_specialize=WARP_SPECIALIZE):  # fmt: skip
        i_m, i_n = _grouped_tile(i_tile, num_m, num_n, GROUP_M)
        _prompt_tile(p_x, p_xs, p_w, p_ws, p_y, desc_x, desc_w, i_m, i_n, M, N, K,
                     num_k_blocks, stride_xs_k, BM, BN, BK, SCALE_ROWS, IS_INTERPRETED, TMA,
                     FOLD_SCALES)  # fmt: skip


def fp8_gemm_prompt(
    x: torch.Tensor,
    weight: torch.Tensor,
    weight_scale_inv: torch.Tensor,
    config: Fp8PromptConfig | None = None,
    *,
    x_fp8: Fp8Activation | None = None,
) -> torch.Tensor:
    """y = x @ W.T with x quantized per token and 128-column group, e4m3 tensor-core dots.

    Args:
        x: [M, K] activations (bf16, fp16 or fp32), unit stride along K.
        weight: [N, K] float8_e4m3fn, contiguous.
        weight_scale_inv: [ceil(N/128), ceil(K/128)] (or [N, ceil(K/128)]) fp32, contiguous.
        config: tiles (BK is the 128 of the scale blocks).
        x_fp8: x already quantized (`quantize_activation_fp8`'s bits, e.g. by the norm before
            it): read instead of quantizing x (the same y).

    Returns:
        y: [M, N] contiguous in x.dtype (the specification is `fp8_linear_prompt_ref`).
    """
    rows_per_scale = check_fp8_operands("fp8_gemm_prompt", x, weight, weight_scale_inv)
    cfg = config or Fp8PromptConfig()
    (m, k), n = x.shape, weight.shape[0]
    y = torch.empty((m, n), dtype=x.dtype, device=x.device)
    if m == 0 or n == 0:
        return y
    if k == 0:
        return y.zero_()
    if x_fp8 is not None:
        check_fp8_activation("fp8_gemm_prompt", x, x_fp8)
    x_q, x_scale = x_fp8 if x_fp8 is not None else quantize_activation_fp8(x)
    num_tiles = triton.cdiv(m, cfg.BM) * triton.cdiv(n, cfg.BN)
    use_tma = (cfg.TMA and tma_device_error(x) is None
               and all(tma_aligned(t, k) for t in (x_q, weight)))  # fmt: skip
    descs = (x_q, weight)  # not read without TMA
    if use_tma:
        descs = (
            TensorDescriptor(x_q, [m, k], [k, 1], [cfg.BM, BLOCK]),
            TensorDescriptor(weight, [n, k], [k, 1], [cfg.BN, BLOCK]),
        )
    args = (
        x_q, x_scale, weight, weight_scale_inv, y, *descs,
        m, n, k, x_scale.shape[1], x_scale.stride(1),
        cfg.BM, cfg.BN, BLOCK, cfg.GROUP_M, rows_per_scale, not x.is_cuda, use_tma,
        cfg.FOLD_SCALES and rows_per_scale % cfg.BN == 0,
    )  # fmt: skip
    if cfg.PERSISTENT:
        programs = min(num_tiles, num_multiprocessors(x.device))
        _fp8_prompt_persistent_kernel[(programs,)](
            *args, programs, cfg.WARP_SPECIALIZE,
            num_warps=cfg.num_warps, num_stages=cfg.num_stages,
        )  # fmt: skip
    else:
        _fp8_prompt_kernel[(num_tiles,)](*args, num_warps=cfg.num_warps, num_stages=cfg.num_stages)
    return y
