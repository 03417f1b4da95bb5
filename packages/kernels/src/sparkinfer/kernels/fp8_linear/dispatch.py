"""`fp8_linear`: y = x @ W.T for a block-scaled e4m3 weight, by row count.

- one row: the GEMV (bf16 activation, the weight streamed by many programs, no tensor cores);
- up to DECODE_MAX_ROWS rows: the decode GEMM (bf16 activations, the weight read once);
  both with the tile `tiles.py` names for the shape (K split for the narrow projections);
- more rows: the prompt GEMM (activations quantized per token and group, e4m3 tensor cores);
- inside `linear.batch_invariant(phase)`: the phase's kernel with one fixed tile for every row
  count ("decode": the decode GEMM in 16-row tiles; "prefill": the prompt GEMM), so a row's
  bits never depend on the batch it shares (both kernels reduce each row alone, in K order);
- CPU tensors (outside the interpreter): the reference.
"""

from __future__ import annotations

import torch
from sparkinfer.kernels._triton import is_interpreting
from sparkinfer.kernels.fp8_linear.decode import Fp8DecodeConfig, fp8_gemm_decode
from sparkinfer.kernels.fp8_linear.gemv import fp8_gemv
from sparkinfer.kernels.fp8_linear.prompt import Fp8PromptConfig, fp8_gemm_prompt
from sparkinfer.kernels.fp8_linear.ref import fp8_linear_ref
from sparkinfer.kernels.fp8_linear.tiles import decode_tile, gemv_tile
from sparkinfer.kernels.linear.invariant import current_phase

DECODE_MAX_ROWS = 64  # decode batches; prompt chunks are longer
DECODE_INVARIANT_CONFIG = Fp8DecodeConfig(BM=16)  # one slice: K order, whatever M
PROMPT_CONFIG = Fp8PromptConfig()


def fp8_linear(
    x: torch.Tensor, weight: torch.Tensor, weight_scale_inv: torch.Tensor
) -> torch.Tensor:
    """y = x @ W.T with W the block-scaled FP8 weight, by the decode or the prompt GEMM.

    Args:
        x: [M, K] activations (bf16, fp16 or fp32), unit stride along K.
        weight: [N, K] float8_e4m3fn, contiguous.
        weight_scale_inv: [ceil(N/128), ceil(K/128)] (or [N, ceil(K/128)]) fp32 scales.

    Returns:
        y: [M, N] in x.dtype, accumulated in fp32.
    """
    if not x.is_cuda and not is_interpreting():
        return fp8_linear_ref(x, weight, weight_scale_inv)
    phase = current_phase()
    if phase == "decode":
        return fp8_gemm_decode(x, weight, weight_scale_inv, DECODE_INVARIANT_CONFIG)
    if phase == "prefill":
        return fp8_gemm_prompt(x, weight, weight_scale_inv, PROMPT_CONFIG)
    (m, k), n = x.shape, weight.shape[0]
    if m == 1:
        return fp8_gemv(x, weight, weight_scale_inv, gemv_tile(n, k))
    if m <= DECODE_MAX_ROWS:
        return fp8_gemm_decode(x, weight, weight_scale_inv, decode_tile(m, n, k))
    return fp8_gemm_prompt(x, weight, weight_scale_inv, PROMPT_CONFIG)
