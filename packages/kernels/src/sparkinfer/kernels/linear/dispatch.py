"""`linear`: per shape, the faster of the Triton skinny GEMM and cuBLAS, from the measured table;
`silu_mul_linear`: the MLP's SwiGLU and down projection, fused where `linear` takes the skinny GEMM.

Shapes absent from `shape_table`, rows beyond its largest bucket and CPU tensors go to torch
(cuBLAS on CUDA). Inside `invariant.batch_invariant(phase)` CUDA calls take that phase's fixed
kernel instead.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from sparkinfer.kernels.activation import silu_and_mul
from sparkinfer.kernels.linear._checks import check_silu_mul_operands
from sparkinfer.kernels.linear.invariant import current_phase, invariant_linear
from sparkinfer.kernels.linear.shape_table import lookup
from sparkinfer.kernels.linear.skinny_gemm import silu_mul_skinny_gemm, skinny_gemm


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


def silu_mul_linear(gate_up: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """y = (silu(gate) * up) @ weight.T for gate_up = [gate | up]: SwiGLU, then down_proj.

    Where `linear` would run the skinny GEMM for [M, I] x [N, I], one launch builds the activation
    in the GEMM's x tiles (bit-identical to silu_and_mul, then that skinny GEMM). Elsewhere (a
    cuBLAS shape, M beyond the skinny buckets, a batch-invariant phase, CPU tensors) it runs
    silu_and_mul, then `linear`, with their numerics unchanged.

    Args:
        gate_up: [M, 2 * I] (bf16, fp16 or fp32): the gate half, then the up half; unit stride
            along the last dim.
        weight: [N, I] weight in the checkpoint's layout, same dtype.

    Returns:
        y: [M, N] in gate_up.dtype, accumulated in fp32.
    """
    check_silu_mul_operands("silu_mul_linear", gate_up, weight)
    if gate_up.is_cuda and current_phase() is None:
        config = lookup(gate_up.shape[0], weight.shape[0], weight.shape[1], gate_up.dtype)
        if config is not None:
            return silu_mul_skinny_gemm(gate_up, weight, config)
    return linear(silu_and_mul(gate_up), weight)
