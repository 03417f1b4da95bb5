"""SwiGLU MLP: down_proj(silu(gate) * up) with [gate | up] from one GEMM (SPEC §6).

gate_up_proj stacks the checkpoint's gate_proj and up_proj by rows (weights.py), so decode reads
both weights in one launch. The activation and down_proj run as one op (`silu_mul_linear`): on
CUDA, at decode shapes where the skinny GEMM wins, one kernel computes silu(gate) * up while it
loads the GEMM's input tiles, saving a launch per layer; elsewhere silu_and_mul, then the GEMM.
"""

from __future__ import annotations

import torch
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
        self.ops = ops
        dims = {"ops": ops, "device": device, "dtype": dtype}
        self.intermediate_size = intermediate_size
        self.gate_up_proj = Linear(hidden_size, 2 * intermediate_size, **dims)
        # Holds the weight; forward passes it to silu_mul_linear rather than calling the module.
        self.down_proj = Linear(intermediate_size, hidden_size, **dims)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """x [T, hidden] -> [T, hidden]."""
        gate_up = self.gate_up_proj(x)  # [T, 2 * I]: [gate | up]
        return self.ops.silu_mul_linear(gate_up, self.down_proj.weight)
