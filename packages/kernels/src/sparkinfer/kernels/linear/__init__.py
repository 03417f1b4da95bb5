"""Decode-shaped linear layer: skinny GEMM against bf16 weights."""

from sparkinfer.kernels.linear.ref import linear_ref

__all__ = ["linear_ref"]
