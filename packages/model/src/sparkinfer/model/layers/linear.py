"""Bias-free linear layer: torch's GEMM on CPU; on CUDA the kernels' `linear`, which picks the
skinny GEMM or cuBLAS per shape from its measured table. After `use_fp8` the weight is
block-scaled e4m3 (the kernels' `fp8_linear`; on CPU its dequantizing reference)."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from sparkinfer.kernels.fp8_linear import Fp8Activation
from sparkinfer.model.layers import KernelOps, new_parameter
from torch import nn

FP8_BLOCK = 128  # rows and columns of a weight's scale block


class Linear(nn.Module):
    """y = x @ weight.T with weight [out_features, in_features], the checkpoint's layout.

    FP8 (`use_fp8(rows)`): `weight` holds the first `rows` output rows as float8_e4m3fn with
    `weight_scale_inv` [ceil(rows/128), ceil(in/128)] fp32 beside it; `tail_weight` holds the
    remaining rows in the model dtype (GDN's in_proj: in_proj_b and in_proj_a stay bf16 in Qwen's
    FP8 checkpoints), and the two outputs are concatenated. The norm before it may hand over x
    already quantized (`RMSNorm.forward_for`), which the FP8 GEMMs taking e4m3 rows read.
    """

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
        self.in_features, self.out_features = in_features, out_features
        self.weight = new_parameter(out_features, in_features, device=device, dtype=dtype)
        self.register_parameter("weight_scale_inv", None)
        self.register_parameter("tail_weight", None)
        self.ops = ops

    @property
    def is_fp8(self) -> bool:
        return self.weight_scale_inv is not None

    def use_fp8(self, num_fp8_rows: int) -> None:
        """Hold the first `num_fp8_rows` output rows as block-scaled e4m3 (uninitialised: the
        loader fills them), the rest in the current dtype; frees the previous weight."""
        assert 0 < num_fp8_rows <= self.out_features, "the FP8 rows lie inside the weight"
        device, dtype, k = self.weight.device, self.weight.dtype, self.in_features
        num_tail = self.out_features - num_fp8_rows
        self.weight = new_parameter(num_fp8_rows, k, device=device, dtype=torch.float8_e4m3fn)
        self.weight_scale_inv = new_parameter(
            -(-num_fp8_rows // FP8_BLOCK), -(-k // FP8_BLOCK), device=device, dtype=torch.float32
        )
        if num_tail:
            self.tail_weight = new_parameter(num_tail, k, device=device, dtype=dtype)

    def forward(self, x: torch.Tensor, x_fp8: Fp8Activation | None = None) -> torch.Tensor:
        """x [T, in_features] -> [T, out_features]; x_fp8: x quantized per token and group
        (`quantize_activation_fp8(x)`'s bits), read by an FP8 weight's GEMM where it takes e4m3."""
        if self.weight_scale_inv is None:
            return self._dense(x, self.weight)
        y = self.ops.fp8_linear(x, self.weight, self.weight_scale_inv, x_fp8=x_fp8)
        if self.tail_weight is None:
            return y
        return torch.cat((y, self._dense(x, self.tail_weight)), dim=1)

    def _dense(self, x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        if self.ops.linear is not None:
            return self.ops.linear(x, weight)
        return F.linear(x, weight)
