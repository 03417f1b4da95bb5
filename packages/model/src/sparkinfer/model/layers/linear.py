"""Bias-free linear layer: torch's GEMM, or the skinny decode GEMM kernel for few rows on CUDA."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from sparkinfer.model.layers import KernelOps, new_parameter
from torch import nn

# Up to this many rows (decode batches) the skinny GEMM kernel beats cuBLAS.
SKINNY_MAX_ROWS = 16


class Linear(nn.Module):
    """y = x @ weight.T with weight [out_features, in_features], the checkpoint's layout."""

    def __init__(
        self,
        in_features: int,
        out_features: int,
        *,
        ops: KernelOps,
        device: torch.device,
        dtype: torch.dtype,
    ) -> None:
        super().__init__()
        self.weight = new_parameter(out_features, in_features, device=device, dtype=dtype)
        self.ops = ops

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """x [T, in_features] -> [T, out_features]."""
        if self.ops.linear is not None and x.shape[0] <= SKINNY_MAX_ROWS:
            return self.ops.linear(x, self.weight)
        return F.linear(x, self.weight)
