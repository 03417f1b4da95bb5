"""The two RMSNorm flavours of Qwen3.5/3.8 (model.md §3): zero-centred (1+w) and gated (plain w)."""

from __future__ import annotations

import torch
from sparkinfer.kernels.fp8_linear import Fp8Activation
from sparkinfer.model.layers import KernelOps, new_parameter
from sparkinfer.model.layers.linear import Linear
from torch import nn


class RMSNorm(nn.Module):
    """Zero-centred RMSNorm, y = norm(x) * (1 + w), with an optional fused residual add.

    Used for input/post-attention layernorms, the final norm and the q/k norms. The stored weight
    is the delta around 1, exactly as in the checkpoint (never add 1 on load).
    """

    def __init__(
        self, dim: int, eps: float, *, ops: KernelOps, device: torch.device, dtype: torch.dtype
    ) -> None:
        super().__init__()
        self.weight = new_parameter(dim, device=device, dtype=dtype)
        self.eps = eps
        self.ops = ops

    def forward(
        self, x: torch.Tensor, residual: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """x [..., dim] -> (y, residual_out); residual_out = x + residual (or x without one)."""
        return self.ops.rms_norm(x, self.weight, self.eps, residual=residual)

    def forward_for(
        self, linear: Linear, x: torch.Tensor, residual: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, torch.Tensor, Fp8Activation | None]:
        """`forward` for the input of `linear`: with an FP8 weight also y quantized per token
        and 128-column group in the same kernel (`rms_norm_quantize_fp8`: y has `forward`'s bits),
        for `linear(y, x_fp8)`; else None beside y."""
        if not linear.is_fp8:
            return (*self(x, residual), None)
        return self.ops.rms_norm_quantize_fp8(x, self.weight, self.eps, residual=residual)


class GatedRMSNorm(nn.Module):
    """Gated-DeltaNet output norm: y = w * norm(x) * silu(z), weight shared by all value heads."""

    def __init__(
        self, dim: int, eps: float, *, ops: KernelOps, device: torch.device, dtype: torch.dtype
    ) -> None:
        super().__init__()
        self.weight = new_parameter(dim, device=device, dtype=dtype)
        self.eps = eps
        self.ops = ops

    def forward(self, x: torch.Tensor, z: torch.Tensor) -> torch.Tensor:
        """x, z [..., dim] -> y [..., dim] in x.dtype."""
        return self.ops.gated_rms_norm(x, z, self.weight, self.eps)
