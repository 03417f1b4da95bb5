"""Activations quantized per token and 128-column group to e4m3, in one Triton kernel, for the
GEMMs that take e4m3 activations (the prompt GEMM and cuBLAS's block-scaled GEMM).

Each program loads a [BR, 128] tile of rows, takes each row's amax, divides by scale = amax / 448
and rounds to e4m3 on the bits (`round_to_e4m3`), writing the e4m3 tile and BR scales. The scales
are stored outer-dim major ([P, ceil(K/128)] with strides (1, P): one group's scales contiguous),
the layout cuBLAS's 1x128 block scaling reads, and the rows can be padded to a multiple the
GEMM needs (zero rows). The specification is `ref.quantize_activation_fp8_ref`.
"""

# Triton's annotations misread valid kernel code: num_warps.
# pyright: reportCallIssue=false

from __future__ import annotations

import torch
import triton
import triton.language as tl
from sparkinfer.kernels._triton import check_device
from sparkinfer.kernels.fp8_linear._checks import ACTIVATION_DTYPES
from sparkinfer.kernels.fp8_linear.ref import BLOCK, FP8_DTYPE, FP8_MAX

QUANTIZE_ROWS = 16  # rows per program: a group's 16 scales are one 64-byte store


@triton.jit
def round_to_e4m3(v):
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
def _quantize_groups_kernel(
    p_x, p_q, p_s, M, P, K, stride_xm,
    BR: tl.constexpr, GROUP: tl.constexpr, FP8_LIMIT: tl.constexpr,
):  # fmt: skip
    i_r, i_g = tl.program_id(0), tl.program_id(1)
    o_r = i_r.to(tl.int64) * BR + tl.arange(0, BR).to(tl.int64)
    o_k = i_g.to(tl.int64) * GROUP + tl.arange(0, GROUP).to(tl.int64)
    m_k = o_k < K
    m_x = (o_r < M)[:, None] & m_k[None, :]  # rows M..P-1 are padding: zeros
    b_x = tl.load(p_x + o_r[:, None] * stride_xm + o_k[None, :], mask=m_x, other=0.0)
    b_x = b_x.to(tl.float32)
    b_scale = tl.maximum(tl.max(tl.abs(b_x), axis=1), 1e-12) / FP8_LIMIT  # [BR]
    b_q = round_to_e4m3(tl.clamp(b_x / b_scale[:, None], -FP8_LIMIT, FP8_LIMIT))
    m_r = o_r < P
    tl.store(p_q + o_r[:, None] * K + o_k[None, :], b_q.to(p_q.dtype.element_ty),
             mask=m_r[:, None] & m_k[None, :])  # fmt: skip
    tl.store(p_s + i_g.to(tl.int64) * P + o_r, b_scale, mask=m_r)


def quantize_activation_fp8(
    x: torch.Tensor, row_multiple: int = 1
) -> tuple[torch.Tensor, torch.Tensor]:
    """Activations [M, K] -> (e4m3 [P, K], scales [P, ceil(K/128)] fp32), per token and group.

    Args:
        x: [M, K] bf16, fp16 or fp32, unit stride along K.
        row_multiple: P is M rounded up to a multiple of it; rows past M are zero.

    Returns:
        (x_fp8 [P, K] contiguous float8_e4m3fn, x_scale [P, ceil(K/128)] fp32 with strides
        (1, P)): x ~ x_fp8 * x_scale repeated over each group's 128 columns.
    """
    if x.dim() != 2 or x.dtype not in ACTIVATION_DTYPES or (x.numel() and x.stride(1) != 1):
        raise ValueError(
            f"quantize_activation_fp8: x must be [M, K] bf16/fp16/fp32 with unit stride along K, "
            f"got {tuple(x.shape)} {x.dtype} strides {x.stride()}"
        )
    if row_multiple < 1:
        raise ValueError(f"quantize_activation_fp8: row_multiple is {row_multiple}; use 1 or more")
    check_device("quantize_activation_fp8", {"x": x})
    m, k = x.shape
    p, num_groups = triton.cdiv(m, row_multiple) * row_multiple, triton.cdiv(k, BLOCK)
    q = torch.empty((p, k), dtype=FP8_DTYPE, device=x.device)
    scale = torch.empty((num_groups, p), dtype=torch.float32, device=x.device).t()
    if p and k:
        grid = (triton.cdiv(p, QUANTIZE_ROWS), num_groups)
        _quantize_groups_kernel[grid](
            x, q, scale, m, p, k, x.stride(0),
            BR=QUANTIZE_ROWS, GROUP=BLOCK, FP8_LIMIT=FP8_MAX, num_warps=4,
        )  # fmt: skip
    return q, scale
