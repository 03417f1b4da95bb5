"""Plain-torch linear layer without bias, and with the SwiGLU after it: the specifications of
`linear` and `linear_swiglu`."""

from __future__ import annotations

import torch
from sparkinfer.kernels.activation import silu_and_mul_ref


def linear_ref(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """y = x @ weight.T, accumulated in fp32.

    Args:
        x: [M, K] activations (bf16 or fp32).
        weight: [N, K] weight in the checkpoint's layout, same dtype as x.

    Returns:
        y: [M, N] in x.dtype.
    """
    return (x.float() @ weight.float().T).to(x.dtype)


def linear_swiglu_ref(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """silu(gate) * up for [gate | up] = x @ weight.T.

    Args:
        x: [M, K] activations (bf16, fp16 or fp32), unit stride along K.
        weight: [2 * I, K] gate_proj and up_proj stacked by rows, same dtype.

    Returns:
        y: [M, I] in x.dtype.
    """
    return silu_and_mul_ref(linear_ref(x, weight))
