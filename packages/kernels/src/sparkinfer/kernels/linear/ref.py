"""Plain-torch linear layer without bias: the specification for the skinny GEMM."""

from __future__ import annotations

import torch


def linear_ref(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """y = x @ weight.T, accumulated in fp32.

    Args:
        x: [M, K] activations (bf16 or fp32).
        weight: [N, K] weight in the checkpoint's layout, same dtype as x.

    Returns:
        y: [M, N] in x.dtype.
    """
    return (x.float() @ weight.float().T).to(x.dtype)
