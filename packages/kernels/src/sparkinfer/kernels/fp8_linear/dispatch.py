"""`fp8_linear`: y = x @ W.T for a block-scaled e4m3 weight, by row count.

`fp8_kernel_for` is the one decision: the kernel the current routes (`routes.py`, tunable per
`tuning.KernelTuning`) name for M rows, each Triton kernel with the tile `tiles.py` names for
the shape. Two cases override the routes:

- inside `linear.batch_invariant(phase)`: the phase's batch-invariant kernel (`invariant.py`:
  "decode": the swap-AB GEMM with one K plan per weight shape for every row count; "prefill":
  the prompt GEMM in one fixed tile), so a row's bits never depend on the batch it shares
  (cuBLAS picks its algorithm by shape, so it is never taken there);
- "cublas" where cuBLAS cannot take the operands (`cublas.cublas_accepts`): the Triton kernel of
  the same rows.

An x quantized before (`x_fp8`, by the norm before the linear) goes to the kernels that take e4m3
activations (the batch-invariant ones too); the others read x. CPU tensors (outside the
interpreter) run the reference.
"""

from __future__ import annotations

import torch
from sparkinfer.kernels._triton import is_interpreting
from sparkinfer.kernels.fp8_linear.cublas import cublas_accepts, fp8_gemm_cublas
from sparkinfer.kernels.fp8_linear.decode import fp8_gemm_decode
from sparkinfer.kernels.fp8_linear.gemv import fp8_gemv
from sparkinfer.kernels.fp8_linear.invariant import INVARIANT_PROMPT_CONFIG, invariant_fp8_linear
from sparkinfer.kernels.fp8_linear.prompt import fp8_gemm_prompt
from sparkinfer.kernels.fp8_linear.ref import Fp8Activation, fp8_linear_ref
from sparkinfer.kernels.fp8_linear.routes import DECODE_MAX_ROWS, FP8_ROUTES, Fp8Kernel, route_for
from sparkinfer.kernels.fp8_linear.swap_ab import fp8_gemm_swap_ab
from sparkinfer.kernels.fp8_linear.tiles import decode_tile, gemv_tile, swap_ab_tile
from sparkinfer.kernels.linear.invariant import current_phase
from sparkinfer.kernels.tuning import current_tuning

PROMPT_CONFIG = INVARIANT_PROMPT_CONFIG  # one prompt tile, in the batch-invariant mode or not


def fp8_kernel_for(
    x: torch.Tensor, weight: torch.Tensor, weight_scale_inv: torch.Tensor
) -> Fp8Kernel:
    """The kernel `fp8_linear` runs for these operands (see the module docstring)."""
    phase = current_phase()
    if phase is not None:
        return "swap_ab" if phase == "decode" else "prompt"
    m = x.shape[0]
    kernel = route_for(current_tuning().fp8_routes or FP8_ROUTES, m)
    if kernel == "gemv" and m != 1:
        kernel = "decode"
    if kernel == "cublas" and not cublas_accepts(x, weight, weight_scale_inv):
        kernel = "decode" if m <= DECODE_MAX_ROWS else "prompt"
    return kernel


def fp8_linear(
    x: torch.Tensor,
    weight: torch.Tensor,
    weight_scale_inv: torch.Tensor,
    *,
    x_fp8: Fp8Activation | None = None,
) -> torch.Tensor:
    """y = x @ W.T with W the block-scaled FP8 weight, by the kernel `fp8_kernel_for` picks.

    Args:
        x: [M, K] activations (bf16, fp16 or fp32), unit stride along K.
        weight: [N, K] float8_e4m3fn, contiguous.
        weight_scale_inv: [ceil(N/128), ceil(K/128)] (or [N, ceil(K/128)]) fp32 scales.
        x_fp8: x already quantized per token and group, `quantize_activation_fp8(x)`'s bits (the
            norm before the linear gives it, `rms_norm_quantize_fp8`): the kernels that take e4m3
            activations (swap-AB, prompt, cuBLAS) read it instead of quantizing x, the others read
            x, so the kernel and y are the same either way.

    Returns:
        y: [M, N] in x.dtype, accumulated in fp32.
    """
    if not x.is_cuda and not is_interpreting():
        return fp8_linear_ref(x, weight, weight_scale_inv)
    phase = current_phase()
    if phase is not None:
        return invariant_fp8_linear(x, weight, weight_scale_inv, phase, x_fp8=x_fp8)
    kernel = fp8_kernel_for(x, weight, weight_scale_inv)
    (m, k), n = x.shape, weight.shape[0]
    if kernel == "gemv":
        return fp8_gemv(x, weight, weight_scale_inv, gemv_tile(n, k))
    if kernel == "swap_ab":
        tile = swap_ab_tile(m, n, k)
        return fp8_gemm_swap_ab(x, weight, weight_scale_inv, tile, x_fp8=x_fp8)
    if kernel == "cublas":
        return fp8_gemm_cublas(x, weight, weight_scale_inv, x_fp8=x_fp8)
    if kernel == "prompt":
        return fp8_gemm_prompt(x, weight, weight_scale_inv, PROMPT_CONFIG, x_fp8=x_fp8)
    return fp8_gemm_decode(x, weight, weight_scale_inv, decode_tile(m, n, k))
