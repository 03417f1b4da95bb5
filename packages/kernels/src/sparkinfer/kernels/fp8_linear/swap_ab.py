"""Few-row FP8 GEMM on the FP8 tensor cores, weight rows on the MMA's wide side (swap AB).

A decode batch has few rows, so `fp8_gemm_swap_ab` computes y.T = W @ x.T: each program owns BN
weight rows (the MMA's M side, 64 or more for Hopper's warpgroup MMA) against a BM-row tile of x
(its N side, 16 for one to 16 rows) and walks K in 128-column steps, each in one scale block. The
weight tile goes to the tensor cores as stored, in e4m3: no conversion per weight element, so the
kernel streams the weight near the memory's pace. x is quantized per token and 128-column group
(scale = amax / 448, the prompt path's scheme, `fp8_linear_prompt_ref` is the specification):
in registers, each program its step's tile (no second launch; the work grows with BM), or with
PREQUANTIZE once by `quantize.quantize_activation_fp8` before the launch, or taken as the norm
before it quantized it (`x_fp8`). Each step's dot is
scaled by the weight rows' block scales and x's group scales in fp32. SPLIT_K cuts K into
slices summed by the last slice to finish (`_split_k`, deterministic). The row tiles of one
weight tile are neighbouring programs, so past BM rows they read its bytes from L2. Under the CPU
interpreter the dot runs on fp32 copies of the e4m3 values (exact there), rounded on the bits
(`quantize.round_to_e4m3`).
"""

# Triton's annotations misread valid kernel code: num_warps/num_stages, constexpr arguments.
# pyright: reportCallIssue=false, reportArgumentType=false

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl
from sparkinfer.kernels.dependent_launch import (
    dependent_launch,
    prefetch_to_l2,
    wait_for_prior_kernels,
)
from sparkinfer.kernels.fp8_linear._checks import check_fp8_activation, check_fp8_operands
from sparkinfer.kernels.fp8_linear._split_k import split_k_buffers, store_or_reduce
from sparkinfer.kernels.fp8_linear.decode import decode_row_tile
from sparkinfer.kernels.fp8_linear.quantize import quantize_activation_fp8, round_to_e4m3
from sparkinfer.kernels.fp8_linear.ref import BLOCK, FP8_MAX, Fp8Activation
from sparkinfer.kernels.split_k import split_k_plan


@dataclass(frozen=True)
class Fp8SwapAbConfig:
    """Tiles of one swap-AB launch: BN weight rows per program, BM rows of x (None: 16, 32 or 64,
    the smallest holding M), K cut into at most SPLIT_K slices run by separate programs; x
    quantized before the launch (PREQUANTIZE) or in registers by every program. DEPENDENT:
    launch as a programmatic dependent where the tuning allows (`dependent_launch`), each
    program first asking L2 for its first PREFETCH K steps of weight (CUDA only), which no
    kernel before writes, while the kernel before ends."""

    BN: int = 64
    BM: int | None = None
    num_warps: int = 4
    num_stages: int = 4
    SPLIT_K: int = 1
    PREQUANTIZE: bool = False
    DEPENDENT: bool = False
    PREFETCH: int = 0


@triton.jit
def _fp8_swap_ab_kernel(
    p_x, p_xs, p_w, p_s, p_y, p_part, p_arrived,
    M, N, K, stride_xm, stride_xs_k, num_k_blocks, K_PER_SPLIT,
    BN: tl.constexpr, BM: tl.constexpr, BK: tl.constexpr, SCALE_ROWS: tl.constexpr,
    FP8_LIMIT: tl.constexpr, SPLIT_K: tl.constexpr, X_QUANTIZED: tl.constexpr,
    IS_INTERPRETED: tl.constexpr, USE_PDL: tl.constexpr, PREFETCH: tl.constexpr,
):  # fmt: skip
    i_m, i_n, i_k = tl.program_id(0), tl.program_id(1), tl.program_id(2)  # row tiles fastest
    o_n = i_n.to(tl.int64) * BN + tl.arange(0, BN).to(tl.int64)
    o_m = i_m.to(tl.int64) * BM + tl.arange(0, BM).to(tl.int64)
    m_n, m_m = o_n < N, o_m < M
    p_sn = p_s + (o_n // SCALE_ROWS) * num_k_blocks  # each weight row's row of scales
    k_start = i_k.to(tl.int64) * K_PER_SPLIT
    k_end = tl.minimum(k_start + K_PER_SPLIT, K)
    if PREFETCH > 0:  # one 128-byte line per weight row and step: a step's 128 e4m3 columns
        o_pk = k_start + tl.arange(0, PREFETCH).to(tl.int64) * BK
        m_pf = m_n[:, None] & (o_pk < k_end)[None, :]
        prefetch_to_l2(tl.where(m_pf, p_w + o_n[:, None] * K + o_pk[None, :], p_w))
    wait_for_prior_kernels(USE_PDL)  # x, y and the split-K counters only after it
    b_acc = tl.zeros((BN, BM), dtype=tl.float32)
    for k0 in range(k_start, k_end, BK):
        o_k = k0 + tl.arange(0, BK).to(tl.int64)
        m_k = o_k < k_end
        b_w = tl.load(p_w + o_n[:, None] * K + o_k[None, :], mask=m_n[:, None] & m_k[None, :],
                      other=0.0)  # fmt: skip
        p_xk = p_x + o_m[:, None] * stride_xm + o_k[None, :]
        m_xk = m_m[:, None] & m_k[None, :]
        if X_QUANTIZED:  # e4m3 x and its scales, from `quantize_activation_fp8`
            b_xq = tl.load(p_xk, mask=m_xk, other=0.0)
            b_xs = tl.load(p_xs + (k0 // BK) * stride_xs_k + o_m, mask=m_m, other=0.0)
            b_xd = b_xq.to(tl.float32) if IS_INTERPRETED else b_xq
        else:
            b_x = tl.load(p_xk, mask=m_xk, other=0.0).to(tl.float32)
            b_xs = tl.maximum(tl.max(tl.abs(b_x), axis=1), 1e-12) / FP8_LIMIT  # [BM]
            b_xc = tl.clamp(b_x / b_xs[:, None], -FP8_LIMIT, FP8_LIMIT)
            b_xd = round_to_e4m3(b_xc) if IS_INTERPRETED else b_xc.to(b_w.dtype)  # RN: as torch
        if IS_INTERPRETED:  # the interpreter's e4m3 dot is inexact: fp32 copies of the values
            b_dot = tl.dot(b_w.to(tl.float32), tl.trans(b_xd))
        else:
            b_dot = tl.dot(b_w, tl.trans(b_xd))
        b_ws = tl.load(p_sn + k0 // BK, mask=m_n, other=0.0)  # [BN]
        b_acc += b_dot * b_ws[:, None] * b_xs[None, :]
    o_y = o_m[None, :] * N + o_n[:, None]
    m_y = m_n[:, None] & m_m[None, :]
    i_tile = i_n * tl.num_programs(0) + i_m
    store_or_reduce(p_y, p_part, p_arrived, b_acc, o_y, m_y, i_tile, i_k, M * N, SPLIT_K)


def fp8_gemm_swap_ab(
    x: torch.Tensor,
    weight: torch.Tensor,
    weight_scale_inv: torch.Tensor,
    config: Fp8SwapAbConfig | None = None,
    *,
    x_fp8: Fp8Activation | None = None,
) -> torch.Tensor:
    """y = x @ W.T for a few rows of x, quantized per token and 128-column group in registers,
    and the block-scaled e4m3 weight W, e4m3 tensor-core dots with fp32 accumulate.

    Args:
        x: [M, K] activations (bf16, fp16 or fp32), unit stride along K; best for M <= 16.
        weight: [N, K] float8_e4m3fn, contiguous.
        weight_scale_inv: [ceil(N/128), ceil(K/128)] (or [N, ceil(K/128)]) fp32, contiguous.
        config: tiles; with SPLIT_K > 1 the rows' sums run in another order.
        x_fp8: x already quantized (`quantize_activation_fp8`'s bits, e.g. by the norm before
            it): read instead of x whatever PREQUANTIZE says (the same e4m3 values and scales as
            the registers' quantization, so the same y).

    Returns:
        y: [M, N] contiguous in x.dtype (the specification is `fp8_linear_prompt_ref`).
    """
    rows_per_scale = check_fp8_operands("fp8_gemm_swap_ab", x, weight, weight_scale_inv)
    cfg = config or Fp8SwapAbConfig()
    (m, k), n = x.shape, weight.shape[0]
    y = torch.empty((m, n), dtype=x.dtype, device=x.device)
    if m == 0 or n == 0:
        return y
    if k == 0:
        return y.zero_()
    bm = cfg.BM or decode_row_tile(m)
    if x_fp8 is not None:
        check_fp8_activation("fp8_gemm_swap_ab", x, x_fp8)
    elif cfg.PREQUANTIZE:
        x_fp8 = Fp8Activation(*quantize_activation_fp8(x))
    x_in, x_scale = x_fp8 if x_fp8 is not None else (x, x)
    if cfg.PREFETCH & (cfg.PREFETCH - 1) or cfg.PREFETCH < 0:
        raise ValueError(f"fp8_gemm_swap_ab: PREFETCH is {cfg.PREFETCH}; use 0 or a power of 2")
    pdl = cfg.DEPENDENT and dependent_launch(x)
    num_slices, k_per_split = split_k_plan(k, cfg.SPLIT_K, BLOCK)
    grid = (triton.cdiv(m, bm), triton.cdiv(n, cfg.BN), num_slices)
    part, arrived = split_k_buffers("fp8_gemm_swap_ab", y, num_slices, grid[0] * grid[1])
    _fp8_swap_ab_kernel[grid](
        x_in, x_scale, weight, weight_scale_inv, y, part, arrived,
        m, n, k, x_in.stride(0), x_scale.stride(-1), weight_scale_inv.shape[1], k_per_split,
        BN=cfg.BN, BM=bm, BK=BLOCK, SCALE_ROWS=rows_per_scale, FP8_LIMIT=FP8_MAX,
        SPLIT_K=num_slices, X_QUANTIZED=x_fp8 is not None, IS_INTERPRETED=not x.is_cuda,
        USE_PDL=pdl, PREFETCH=cfg.PREFETCH if x.is_cuda else 0,
        num_warps=cfg.num_warps, num_stages=cfg.num_stages, launch_pdl=pdl,
    )  # fmt: skip
    return y
