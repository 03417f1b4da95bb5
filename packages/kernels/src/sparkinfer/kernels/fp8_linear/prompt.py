"""Prompt-shaped FP8 GEMM on the FP8 tensor cores, DeepSeek-style block scaling.

Activations are quantized per token and per 128-column group (`quantize_activation_fp8`: scale
= amax / 448, dynamic), then `fp8_gemm_prompt` multiplies e4m3 tiles of x and of the weight
with tl.dot into an fp32 accumulator: each BK = 128 step lies in one activation group and one
weight block, so the step's dot is scaled by x's group scale per row and the weight's block
scale per column before it is added. Under the CPU interpreter the dot runs on fp32 copies of
the e4m3 values (its e4m3 dot is not exact there), which is the same product.
"""

# Triton's annotations misread valid kernel code: num_warps/num_stages, constexpr arguments.
# pyright: reportCallIssue=false, reportArgumentType=false

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl
from sparkinfer.kernels._triton import check_device
from sparkinfer.kernels.fp8_linear._checks import ACTIVATION_DTYPES, check_fp8_operands
from sparkinfer.kernels.fp8_linear.ref import BLOCK, FP8_DTYPE, FP8_MAX


@dataclass(frozen=True)
class Fp8PromptConfig:
    """Tiles of one prompt launch: BM x BN outputs per program, GROUP_M row tiles per group."""

    BM: int = 128
    BN: int = 128
    GROUP_M: int = 8
    num_warps: int = 8
    num_stages: int = 3


@triton.jit
def _round_to_e4m3(v):
    """v (fp32, |v| <= 448) rounded to the nearest e4m3 value, ties to even, still in fp32.

    The cast that follows is then exact. The CPU interpreter's own fp32 -> e4m3 cast drops the
    carry into the exponent (127.9 becomes 64), so the rounding is done here, on the bits.
    """
    b_exp = ((v.to(tl.int32, bitcast=True) >> 23) & 0xFF) - 127
    b_exp = tl.maximum(b_exp, -6)  # below 2^-6 e4m3 is subnormal: steps of 2^-9
    b_step = ((b_exp - 3 + 127) << 23).to(tl.float32, bitcast=True)  # 3 mantissa bits
    b_t = v / b_step
    b_r = tl.floor(b_t + 0.5)
    b_is_odd_tie = (b_r - b_t == 0.5) & (b_r - 2.0 * tl.floor(b_r * 0.5) == 1.0)
    return tl.where(b_is_odd_tie, b_r - 1.0, b_r) * b_step


@triton.jit
def _quantize_rows_kernel(
    p_x, p_q, p_s, K, stride_xm, num_groups, FP8_LIMIT: tl.constexpr, GROUP: tl.constexpr
):
    i_m, i_g = tl.program_id(0).to(tl.int64), tl.program_id(1).to(tl.int64)
    o_k = i_g * GROUP + tl.arange(0, GROUP).to(tl.int64)
    m_k = o_k < K
    b_x = tl.load(p_x + i_m * stride_xm + o_k, mask=m_k, other=0.0).to(tl.float32)
    b_scale = tl.maximum(tl.max(tl.abs(b_x), axis=0), 1e-12) / FP8_LIMIT
    b_q = _round_to_e4m3(tl.clamp(b_x / b_scale, -FP8_LIMIT, FP8_LIMIT))
    tl.store(p_q + i_m * K + o_k, b_q.to(p_q.dtype.element_ty), mask=m_k)
    tl.store(p_s + i_m * num_groups + i_g, b_scale)


def quantize_activation_fp8(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Activations [M, K] -> (e4m3 [M, K], scales [M, ceil(K/128)] fp32), per token and group.

    Args:
        x: [M, K] bf16, fp16 or fp32, unit stride along K.

    Returns:
        (x_fp8 [M, K] contiguous float8_e4m3fn, x_scale [M, ceil(K/128)] fp32): x ~ x_fp8 *
        x_scale repeated over each group's 128 columns.
    """
    if x.dim() != 2 or x.dtype not in ACTIVATION_DTYPES or (x.numel() and x.stride(1) != 1):
        raise ValueError(
            f"quantize_activation_fp8: x must be [M, K] bf16/fp16/fp32 with unit stride along K, "
            f"got {tuple(x.shape)} {x.dtype} strides {x.stride()}"
        )
    check_device("quantize_activation_fp8", {"x": x})
    m, k = x.shape
    num_groups = triton.cdiv(k, BLOCK)
    q = torch.empty((m, k), dtype=FP8_DTYPE, device=x.device)
    scale = torch.empty((m, num_groups), dtype=torch.float32, device=x.device)
    if m and k:
        _quantize_rows_kernel[(m, num_groups)](
            x, q, scale, k, x.stride(0), num_groups, FP8_LIMIT=FP8_MAX, GROUP=BLOCK
        )
    return q, scale


@triton.jit
def _fp8_prompt_kernel(
    p_x, p_xs, p_w, p_ws, p_y,
    M, N, K, num_k_blocks,
    BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr, GROUP_M: tl.constexpr,
    SCALE_ROWS: tl.constexpr, IS_INTERPRETED: tl.constexpr,
):  # fmt: skip
    # Grouped order: GROUP_M row tiles share each column tile while it is in L2.
    i_pid = tl.program_id(0)
    num_m, num_n = tl.cdiv(M, BM), tl.cdiv(N, BN)
    group = GROUP_M * num_n
    first_m = (i_pid // group) * GROUP_M
    group_rows = tl.minimum(num_m - first_m, GROUP_M)
    i_m = first_m + (i_pid % group) % group_rows
    i_n = (i_pid % group) // group_rows
    o_m = i_m.to(tl.int64) * BM + tl.arange(0, BM).to(tl.int64)
    o_n = i_n.to(tl.int64) * BN + tl.arange(0, BN).to(tl.int64)
    m_m, m_n = o_m < M, o_n < N
    p_xsm = p_xs + o_m * num_k_blocks
    p_wsn = p_ws + (o_n // SCALE_ROWS) * num_k_blocks
    b_acc = tl.zeros((BM, BN), dtype=tl.float32)
    for kb in range(0, num_k_blocks):
        o_k = kb * BK + tl.arange(0, BK).to(tl.int64)
        m_k = o_k < K
        b_x = tl.load(p_x + o_m[:, None] * K + o_k[None, :], mask=m_m[:, None] & m_k[None, :],
                      other=0.0)  # fmt: skip
        b_w = tl.load(p_w + o_n[:, None] * K + o_k[None, :], mask=m_n[:, None] & m_k[None, :],
                      other=0.0)  # fmt: skip
        if IS_INTERPRETED:
            b_dot = tl.dot(b_x.to(tl.float32), tl.trans(b_w.to(tl.float32)))
        else:
            b_dot = tl.dot(b_x, tl.trans(b_w))
        b_xs = tl.load(p_xsm + kb, mask=m_m, other=0.0)
        b_ws = tl.load(p_wsn + kb, mask=m_n, other=0.0)
        b_acc += b_dot * b_xs[:, None] * b_ws[None, :]
    o_y = o_m[:, None] * N + o_n[None, :]
    tl.store(p_y + o_y, b_acc.to(p_y.dtype.element_ty), mask=m_m[:, None] & m_n[None, :])


def fp8_gemm_prompt(
    x: torch.Tensor,
    weight: torch.Tensor,
    weight_scale_inv: torch.Tensor,
    config: Fp8PromptConfig | None = None,
) -> torch.Tensor:
    """y = x @ W.T with x quantized per token and 128-column group, e4m3 tensor-core dots.

    Args:
        x: [M, K] activations (bf16, fp16 or fp32), unit stride along K.
        weight: [N, K] float8_e4m3fn, contiguous.
        weight_scale_inv: [ceil(N/128), ceil(K/128)] (or [N, ceil(K/128)]) fp32, contiguous.
        config: tiles (BK is the 128 of the scale blocks).

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
    x_q, x_scale = quantize_activation_fp8(x)
    grid = (triton.cdiv(m, cfg.BM) * triton.cdiv(n, cfg.BN),)
    _fp8_prompt_kernel[grid](
        x_q, x_scale, weight, weight_scale_inv, y,
        m, n, k, x_scale.shape[1],
        BM=cfg.BM, BN=cfg.BN, BK=BLOCK, GROUP_M=cfg.GROUP_M, SCALE_ROWS=rows_per_scale,
        IS_INTERPRETED=not x.is_cuda,
        num_warps=cfg.num_warps, num_stages=cfg.num_stages,
    )  # fmt: skip
    return y
