"""Fused SwiGLU activation: one read of [gate | up], one write of silu(gate) * up.

One program per (row, column block) computes in fp32 and rounds once, instead of torch's two
element-wise kernels and their [T, I] temporary.
"""

# Triton's annotations misread valid kernel code: num_warps launch arguments.
# pyright: reportCallIssue=false

from __future__ import annotations

import torch
import triton
import triton.language as tl
from sparkinfer.kernels._triton import (
    check_device,
    check_dtype,
    check_last_dim_contiguous,
    check_ndim,
)
from sparkinfer.kernels.dependent_launch import dependent_launch, wait_for_prior_kernels

_DTYPES = (torch.bfloat16, torch.float16, torch.float32)
BLOCK = 1024


@triton.jit
def silu_mul(b_gate, b_up):
    """silu(gate) * up in fp32 on fp32 tiles: the one formula every SwiGLU kernel uses, so a
    fused epilogue matches `silu_and_mul` bit for bit."""
    return b_gate * tl.sigmoid(b_gate) * b_up


@triton.jit
def _silu_and_mul_kernel(
    p_x, p_y, width, stride_x, stride_y, BLOCK: tl.constexpr, USE_PDL: tl.constexpr
):
    wait_for_prior_kernels(USE_PDL)
    i_t, i_c = tl.program_id(0).to(tl.int64), tl.program_id(1)
    o_c = i_c * BLOCK + tl.arange(0, BLOCK)
    m_c = o_c < width
    b_gate = tl.load(p_x + i_t * stride_x + o_c, mask=m_c, other=0.0).to(tl.float32)
    b_up = tl.load(p_x + i_t * stride_x + width + o_c, mask=m_c, other=0.0).to(tl.float32)
    b_y = silu_mul(b_gate, b_up)
    tl.store(p_y + i_t * stride_y + o_c, b_y.to(p_y.dtype.element_ty), mask=m_c)


def silu_and_mul(x: torch.Tensor) -> torch.Tensor:
    """silu(gate) * up for x = [gate | up] along the last dim.

    Args:
        x: [T, 2 * I] (bf16, fp16 or fp32): the gate half, then the up half.

    Returns:
        y: [T, I] in x.dtype.
    """
    op = "silu_and_mul"
    check_ndim(op, "x", x, 2, "[T, 2 * I]")
    check_dtype(op, "x", x, _DTYPES)
    check_last_dim_contiguous(op, "x", x)
    if x.shape[1] % 2:
        raise ValueError(f"{op}: x has {x.shape[1]} columns; expected an even 2 * I ([gate | up])")
    check_device(op, {"x": x})
    num_rows, width = x.shape[0], x.shape[1] // 2
    y = torch.empty((num_rows, width), dtype=x.dtype, device=x.device)
    if num_rows == 0 or width == 0:
        return y
    grid = (num_rows, triton.cdiv(width, BLOCK))
    pdl = dependent_launch(x)
    _silu_and_mul_kernel[grid](
        x, y, width, x.stride(0), y.stride(0), BLOCK=BLOCK, USE_PDL=pdl, num_warps=4, launch_pdl=pdl
    )
    return y
