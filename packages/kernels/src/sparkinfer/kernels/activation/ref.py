"""Plain-torch SwiGLU activation: the specification of the fused kernel."""

from __future__ import annotations

import torch
import torch.nn.functional as F


def silu_and_mul_ref(x: torch.Tensor) -> torch.Tensor:
    """silu(gate) * up for x = [gate | up] along the last dim.

    Args:
        x: [T, 2 * I] (bf16, fp16 or fp32): the gate half, then the up half.

    Returns:
        y: [T, I] in x.dtype.
    """
    gate, up = x.chunk(2, dim=-1)
    return F.silu(gate) * up
