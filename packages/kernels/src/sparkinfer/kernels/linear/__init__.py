"""Linear layers: Triton skinny GEMM, one-row GEMV or cuBLAS per shape from a measured table,
and fixed-tile batch-invariant kernels for deterministic serving."""

from sparkinfer.kernels.linear.dispatch import linear, linear_swiglu
from sparkinfer.kernels.linear.gemv import GemvConfig, gemv
from sparkinfer.kernels.linear.invariant import batch_invariant, decode_config, invariant_linear
from sparkinfer.kernels.linear.ref import linear_ref, linear_swiglu_ref
from sparkinfer.kernels.linear.skinny_gemm import SkinnyGemmConfig, skinny_gemm
from sparkinfer.kernels.linear.tiled_gemm import TiledGemmConfig, tiled_gemm

__all__ = [
    "GemvConfig",
    "SkinnyGemmConfig",
    "TiledGemmConfig",
    "batch_invariant",
    "decode_config",
    "gemv",
    "invariant_linear",
    "linear",
    "linear_ref",
    "linear_swiglu",
    "linear_swiglu_ref",
    "skinny_gemm",
    "tiled_gemm",
]
