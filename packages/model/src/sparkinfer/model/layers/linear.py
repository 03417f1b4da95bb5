"""Bias-free linear layer: torch's GEMM on CPU; on CUDA the kernels' `linear`, which picks the
skinny GEMM or cuBLAS per shape from its measured table."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from sparkinfer.model.layers import KernelOps, new_parameter
from torch import nn


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
        if self.ops.linear is not None:
            return self.ops.linear(x, self.weight)
        return F.linear(x, self.weight)
