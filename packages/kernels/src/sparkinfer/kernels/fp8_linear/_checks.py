"""Operand checks of the FP8 GEMMs: clear errors before a Triton launch."""

from __future__ import annotations

import torch
from sparkinfer.kernels._triton import check_device
from sparkinfer.kernels.fp8_linear.ref import BLOCK, FP8_DTYPE, Fp8Activation, scale_rows

ACTIVATION_DTYPES = (torch.bfloat16, torch.float16, torch.float32)


def check_fp8_operands(
    op: str, x: torch.Tensor, weight: torch.Tensor, weight_scale_inv: torch.Tensor
) -> int:
    """x [M, K] 16/32-bit, weight [N, K] e4m3 contiguous, fp32 scales; returns rows per scale."""
    if x.dim() != 2 or weight.dim() != 2:
        raise ValueError(
            f"{op}: x must be [M, K] and weight [N, K], got {tuple(x.shape)}, {tuple(weight.shape)}"
        )
    if x.dtype not in ACTIVATION_DTYPES:
        raise TypeError(f"{op}: x must be bf16, fp16 or fp32, got {x.dtype}")
    if weight.dtype != FP8_DTYPE:
        raise TypeError(f"{op}: weight must be float8_e4m3fn, got {weight.dtype}")
    if weight_scale_inv.dtype != torch.float32:
        raise TypeError(f"{op}: weight_scale_inv must be fp32, got {weight_scale_inv.dtype}")
    if x.shape[1] != weight.shape[1]:
        raise ValueError(f"{op}: x has K={x.shape[1]} but weight [N, K] has K={weight.shape[1]}")
    if x.stride(1) != 1 or not weight.is_contiguous() or not weight_scale_inv.is_contiguous():
        raise ValueError(
            f"{op}: x needs unit stride along K and weight, weight_scale_inv must be contiguous; "
            f"got strides {x.stride()}, {weight.stride()}, {weight_scale_inv.stride()}"
        )
    check_device(op, {"x": x, "weight": weight, "weight_scale_inv": weight_scale_inv})
    return scale_rows(weight, weight_scale_inv)


def check_fp8_activation(op: str, x: torch.Tensor, x_fp8: Fp8Activation) -> None:
    """x_fp8 holds x [M, K] quantized per token and group: e4m3 [P >= M, K] contiguous and fp32
    scales [P, ceil(K/128)] with strides (1, P)."""
    (m, k), (q, scale) = x.shape, x_fp8
    num_rows = q.shape[0] if q.dim() == 2 else -1
    if (
        q.dtype != FP8_DTYPE
        or q.dim() != 2
        or num_rows < m
        or q.shape[1] != k
        or not q.is_contiguous()
        or scale.dtype != torch.float32
        or scale.shape != (num_rows, -(-k // BLOCK))
        or (num_rows > 1 and scale.stride(0) != 1)
        or q.device != x.device
        or scale.device != x.device
    ):
        raise ValueError(
            f"{op}: x_fp8 must be x [{m}, {k}] quantized by quantize_activation_fp8: e4m3 "
            f"[P >= {m}, {k}] and fp32 scales [P, {-(-k // BLOCK)}] with strides (1, P) on "
            f"{x.device}; got {q.dtype} {tuple(q.shape)}, {scale.dtype} {tuple(scale.shape)} "
            f"strides {scale.stride()}"
        )
