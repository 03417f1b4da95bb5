"""SwiGLU MLP: down_proj(silu(gate) * up) with [gate | up] from one GEMM (docs/model.md §6).

gate_up_proj stacks the checkpoint's gate_proj and up_proj by rows (weights.py), so decode reads
both weights in one launch; the kernels' silu_and_mul reads both halves of its output in one pass,
or, for a single decode row, `linear_swiglu` applies it in the GEMM's epilogue.
"""

from __future__ import annotations

import torch
from sparkinfer.kernels.fp8_linear import Fp8Activation
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
        self.down_proj = Linear(intermediate_size, hidden_size, **dims)

    def forward(self, x: torch.Tensor, x_fp8: Fp8Activation | None = None) -> torch.Tensor:
        """x [T, hidden] -> [T, hidden]; x_fp8: x quantized for an FP8 gate_up_proj (`Linear`)."""
        if self.ops.linear_swiglu is not None and not self.gate_up_proj.is_fp8:  # one launch
            return self.down_proj(self.ops.linear_swiglu(x, self.gate_up_proj.weight))
        gate_up = self.gate_up_proj(x, x_fp8)  # [T, 2 * I]: [gate | up]
        return self.down_proj(self.ops.silu_and_mul(gate_up))
