"""Decode-shaped linear layer: Triton skinny GEMM or cuBLAS, per shape from a measured table."""

from sparkinfer.kernels.linear.dispatch import linear
from sparkinfer.kernels.linear.ref import linear_ref
from sparkinfer.kernels.linear.skinny_gemm import SkinnyGemmConfig, skinny_gemm

__all__ = ["SkinnyGemmConfig", "linear", "linear_ref", "skinny_gemm"]
