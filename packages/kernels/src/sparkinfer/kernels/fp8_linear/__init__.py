"""Block-scaled FP8 (e4m3, 128x128 blocks) linear layers: a one-row GEMV and a decode GEMM on
bf16 activations, a few-row swap-AB GEMM and a prompt GEMM on per-token-group e4m3 activations,
cuBLAS's block-scaled GEMM, the table choosing among them by row count, the batch-invariant
kernels of the deterministic mode, and the quantizers."""

from sparkinfer.kernels.fp8_linear.cublas import cublas_accepts, fp8_gemm_cublas
from sparkinfer.kernels.fp8_linear.decode import Fp8DecodeConfig, fp8_gemm_decode
from sparkinfer.kernels.fp8_linear.dispatch import fp8_kernel_for, fp8_linear
from sparkinfer.kernels.fp8_linear.gemv import Fp8GemvConfig, fp8_gemv
from sparkinfer.kernels.fp8_linear.invariant import invariant_fp8_linear
from sparkinfer.kernels.fp8_linear.prompt import Fp8PromptConfig, fp8_gemm_prompt
from sparkinfer.kernels.fp8_linear.quantize import quantize_activation_fp8
from sparkinfer.kernels.fp8_linear.ref import (
    BLOCK,
    CUBLAS_ROW_MULTIPLE,
    FP8_DTYPE,
    FP8_MAX,
    Fp8Activation,
    dequantize_weight_fp8,
    fp8_linear_prompt_ref,
    fp8_linear_ref,
    quantize_activation_fp8_ref,
    quantize_weight_fp8,
)
from sparkinfer.kernels.fp8_linear.routes import FP8_ROUTES, Fp8Route
from sparkinfer.kernels.fp8_linear.swap_ab import Fp8SwapAbConfig, fp8_gemm_swap_ab

__all__ = [
    "BLOCK",
    "CUBLAS_ROW_MULTIPLE",
    "FP8_DTYPE",
    "FP8_MAX",
    "FP8_ROUTES",
    "Fp8Activation",
    "Fp8DecodeConfig",
    "Fp8GemvConfig",
    "Fp8PromptConfig",
    "Fp8Route",
    "Fp8SwapAbConfig",
    "cublas_accepts",
    "dequantize_weight_fp8",
    "fp8_gemm_cublas",
    "fp8_gemm_decode",
    "fp8_gemm_prompt",
    "fp8_gemm_swap_ab",
    "fp8_gemv",
    "fp8_kernel_for",
    "fp8_linear",
    "fp8_linear_prompt_ref",
    "fp8_linear_ref",
    "invariant_fp8_linear",
    "quantize_activation_fp8",
    "quantize_activation_fp8_ref",
    "quantize_weight_fp8",
]
