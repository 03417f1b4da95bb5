"""Plain-torch linear layers without bias: the specification of the skinny GEMM and of the fused
SwiGLU down projection."""

from __future__ import annotations

import torch
import torch.nn.functional as F


def linear_ref(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """y = x @ weight.T, accumulated in fp32.

    Args:
        x: [M, K] activations (bf16 or fp32).
        weight: [N, K] weight in the checkpoint's layout, same dtype as x.

    Returns:
        y: [M, N] in x.dtype.
    """
    return (x.float() @ weight.float().T).to(x.dtype)


def silu_mul_linear_ref(gate_up: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """y = (silu(gate) * up) @ weight.T for gate_up = [gate | up]: SwiGLU, then down_proj.

    The activation is rounded to gate_up's dtype before the GEMM, as in the unfused MLP. The GEMM
    is torch's (fp32 accumulate), the one the model's reference path has always run, so a CPU
    model keeps its bits (and the CPU batch-invariant mode still sees F.silu and F.linear).

    Args:
        gate_up: [M, 2 * I] (bf16, fp16 or fp32): the gate half, then the up half.
        weight: [N, I] weight in the checkpoint's layout, same dtype.

    Returns:
        y: [M, N] in gate_up.dtype.
    """
    gate, up = gate_up.chunk(2, dim=-1)
    return F.linear(F.silu(gate) * up, weight)
