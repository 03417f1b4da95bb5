"""Plain-torch activations: the specifications of the fused kernels."""

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


def sigmoid_gate_ref(x: torch.Tensor, gate: torch.Tensor) -> torch.Tensor:
    """x * sigmoid(gate), computed in fp32.

    Args:
        x: [T, H, D] (bf16, fp16 or fp32), any token/head strides, unit last stride.
        gate: [T, H, D] like x.

    Returns:
        y: [T, H, D] contiguous in x.dtype.
    """
    return (x.float() * torch.sigmoid(gate.float())).to(x.dtype).contiguous()
