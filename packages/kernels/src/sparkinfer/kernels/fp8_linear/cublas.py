"""cuBLAS's block-scaled FP8 GEMM (torch's `F.scaled_mm`, DeepSeek's recipe): x quantized per
token and 128-column group by `quantize.quantize_activation_fp8`, the weight's 128x128 block
scales as stored.

Layouts torch checks (and cuBLAS reads): x's scales [M, ceil(K/128)] outer-dim major (strides
(1, M)); the weight passed as its transpose [K, N] with its scales transposed to
[ceil(K/128), ceil(N/128)] (the stored [ceil(N/128), ceil(K/128)] contiguous block, read
transposed), whose row stride must be 16-byte aligned (ceil(K/128) a multiple of 4). cuBLAS
refuses row counts that are not multiples of 4, so the quantizer pads x to
`ref.CUBLAS_ROW_MULTIPLE` rows (zeros) and the padded rows of y are dropped; x quantized before
(by the norm, `x_fp8`) comes padded so. cuBLAS picks its algorithm by shape, so a row's bits
depend on the batch: the batch-invariant mode never routes here. Per-row weight scales, non-bf16
activations and shapes cuBLAS cannot take go to the Triton kernels (`cublas_accepts`).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from sparkinfer.kernels.fp8_linear._checks import check_fp8_activation, check_fp8_operands
from sparkinfer.kernels.fp8_linear.quantize import quantize_activation_fp8
from sparkinfer.kernels.fp8_linear.ref import BLOCK, CUBLAS_ROW_MULTIPLE, Fp8Activation

_ALIGN = 16  # bytes: e4m3 rows of x and W, and the weight scales' row stride


def cublas_accepts(x: torch.Tensor, weight: torch.Tensor, weight_scale_inv: torch.Tensor) -> bool:
    """Whether cuBLAS's block-scaled GEMM takes these operands: CUDA, bf16 x, 128x128 weight
    blocks, K and N multiples of 16 and ceil(K/128) a multiple of 4."""
    (n, k), num_k_blocks = weight.shape, weight_scale_inv.shape[-1]
    return (
        x.is_cuda
        and x.dtype == torch.bfloat16
        and weight_scale_inv.dim() == 2
        and weight_scale_inv.shape[0] == -(-n // BLOCK)
        and n % _ALIGN == 0
        and k % _ALIGN == 0
        and (num_k_blocks * weight_scale_inv.element_size()) % _ALIGN == 0
    )


def fp8_gemm_cublas(
    x: torch.Tensor,
    weight: torch.Tensor,
    weight_scale_inv: torch.Tensor,
    *,
    x_fp8: Fp8Activation | None = None,
) -> torch.Tensor:
    """y = x @ W.T by cuBLAS, x quantized per token and 128-column group (1x128 blocks) and W's
    128x128 blocks.

    Args:
        x: [M, K] bf16 on CUDA, unit stride along K.
        weight: [N, K] float8_e4m3fn, contiguous, N and K multiples of 16.
        weight_scale_inv: [ceil(N/128), ceil(K/128)] fp32, contiguous, ceil(K/128) % 4 == 0.
        x_fp8: x already quantized (`quantize_activation_fp8`'s bits, e.g. by the norm before
            it); taken when its rows are a multiple of CUBLAS_ROW_MULTIPLE, else x is quantized.

    Returns:
        y: [M, N] contiguous bf16 (the specification is `fp8_linear_prompt_ref`).
    """
    check_fp8_operands("fp8_gemm_cublas", x, weight, weight_scale_inv)
    if not cublas_accepts(x, weight, weight_scale_inv):
        raise ValueError(
            f"fp8_gemm_cublas: cuBLAS takes bf16 CUDA x, 128x128 weight blocks, N and K multiples "
            f"of 16 and ceil(K/128) a multiple of 4; got x {x.dtype} on {x.device}, weight "
            f"{list(weight.shape)}, scales {list(weight_scale_inv.shape)}: use fp8_linear"
        )
    m = x.shape[0]
    if m == 0:
        return torch.empty((0, weight.shape[0]), dtype=x.dtype, device=x.device)
    if x_fp8 is not None:
        check_fp8_activation("fp8_gemm_cublas", x, x_fp8)
    if x_fp8 is not None and x_fp8.q.shape[0] % CUBLAS_ROW_MULTIPLE == 0:
        x_q, x_scale = x_fp8
    else:
        x_q, x_scale = quantize_activation_fp8(x, CUBLAS_ROW_MULTIPLE)
    y = F.scaled_mm(
        x_q,
        weight.t(),
        x_scale,
        F.ScalingType.BlockWise1x128,
        weight_scale_inv.t(),
        F.ScalingType.BlockWise128x128,
        output_dtype=x.dtype,
    )
    return y[:m]
