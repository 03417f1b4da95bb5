"""`linear`: per shape, the faster of the Triton skinny GEMM and cuBLAS, from the measured table.

Shapes absent from `shape_table`, rows beyond its largest bucket and CPU tensors go to torch
(cuBLAS on CUDA). Inside `invariant.batch_invariant(phase)` CUDA calls take that phase's fixed
kernel instead.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from sparkinfer.kernels.linear.invariant import current_phase, invariant_linear
from sparkinfer.kernels.linear.shape_table import lookup
from sparkinfer.kernels.linear.skinny_gemm import skinny_gemm


def linear(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """y = x @ weight.T, by whichever of the skinny GEMM and cuBLAS measured faster for the shape.

    Args:
        x: [M, K] activations (bf16, fp16 or fp32), unit stride along K.
        weight: [N, K] weight in the checkpoint's layout, same dtype.

    Returns:
        y: [M, N] in x.dtype, accumulated in fp32.
    """
    if x.is_cuda and x.dim() == 2 and weight.dim() == 2:
        phase = current_phase()
        if phase is not None:
            return invariant_linear(x, weight, phase)
        config = lookup(x.shape[0], weight.shape[0], weight.shape[1], x.dtype)
        if config is not None:
            return skinny_gemm(x, weight, config)
    if x.dtype != weight.dtype:
        raise TypeError(f"x and weight must share a dtype, got {x.dtype} and {weight.dtype}")
    return F.linear(x, weight)
