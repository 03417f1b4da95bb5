"""Operand checks shared by the linear kernels: clear errors before a Triton launch."""

from __future__ import annotations

import torch
from sparkinfer.kernels._triton import check_device

GEMM_DTYPES = (torch.bfloat16, torch.float16, torch.float32)


def check_gemm_operands(op: str, x: torch.Tensor, weight: torch.Tensor) -> None:
    """x [M, K] and weight [N, K]: same float dtype, same K, unit stride along K, one device."""
    if x.dim() != 2 or weight.dim() != 2:
        raise ValueError(
            f"{op}: x must be [M, K] and weight [N, K], got {tuple(x.shape)}, {tuple(weight.shape)}"
        )
    if x.dtype not in GEMM_DTYPES or weight.dtype != x.dtype:
        raise TypeError(
            f"{op}: x and weight must share bf16, fp16 or fp32, got {x.dtype} and {weight.dtype}"
        )
    if x.shape[1] != weight.shape[1]:
        raise ValueError(f"{op}: x has K={x.shape[1]} but weight [N, K] has K={weight.shape[1]}")
    if x.stride(1) != 1 or weight.stride(1) != 1:
        raise ValueError(
            f"{op}: x and weight need unit stride along K, got {x.stride()} and {weight.stride()}"
        )
    check_device(op, {"x": x, "weight": weight})
