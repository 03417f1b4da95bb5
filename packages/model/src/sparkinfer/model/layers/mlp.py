"""SwiGLU MLP: down_proj(silu(gate_proj(x)) * up_proj(x)) (SPEC §6)."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from sparkinfer.model.layers import KernelOps
from sparkinfer.model.layers.linear import Linear
from torch import nn


class MLP(nn.Module):
    """Dense SwiGLU feed-forward block of every decoder layer."""

    def __init__(
        self,
        hidden_size: int,
        intermediate_size: int,
        *,
        ops: KernelOps,
        device: torch.device,
        dtype: torch.dtype,
    ) -> None:
        super().__init__()
        dims = {"ops": ops, "device": device, "dtype": dtype}
        self.gate_proj = Linear(hidden_size, intermediate_size, **dims)
        self.up_proj = Linear(hidden_size, intermediate_size, **dims)
        self.down_proj = Linear(intermediate_size, hidden_size, **dims)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """x [T, hidden] -> [T, hidden]."""
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))
