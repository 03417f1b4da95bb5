"""SwiGLU MLP: down_proj(silu(gate) * up) with [gate | up] from one GEMM (SPEC §6).

gate_up_proj stacks the checkpoint's gate_proj and up_proj by rows (weights.py), so decode reads
both weights in one launch. The decoder layer's post-attention norm runs with it
(`RMSNorm.linear`): for decode rows the GEMM norms its input, and for a single row also applies
the SwiGLU in its epilogue; otherwise the kernels' silu_and_mul reads both halves in one pass.
"""

from __future__ import annotations

import torch
from sparkinfer.model.layers import KernelOps
from sparkinfer.model.layers.linear import Linear
from sparkinfer.model.layers.norm import RMSNorm
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
        self.down_proj = Linear(intermediate_size, hidden_size, **dims)

    def forward(
        self, x: torch.Tensor, residual: torch.Tensor, norm: RMSNorm
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """(x, residual) [T, hidden], before `norm` -> (output [T, hidden], residual stream)."""
        h, stream = norm.linear(x, residual, self.gate_up_proj.weight, swiglu=True)
        return self.down_proj(h), stream
