"""Plain-torch RMSNorms of Qwen3.5/3.8: the specification the Triton kernels are tested against."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from sparkinfer.kernels.fp8_linear.ref import (
    CUBLAS_ROW_MULTIPLE,
    Fp8Activation,
    quantize_activation_fp8_ref,
)


def rms_norm_ref(
    x: torch.Tensor,
    weight: torch.Tensor,
    eps: float,
    *,
    residual: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Zero-centred RMSNorm y = x * rsqrt(mean(x^2) + eps) * (1 + w), with an optional residual add.

    Matches transformers' Qwen3_5RMSNorm: the norm runs in fp32 and is cast to x.dtype at the end.
    With a residual, x + residual is summed first in x.dtype (the residual stream's dtype), normed,
    and returned as the new residual stream.

    Args:
        x: [..., N] activations (bf16, fp16 or fp32).
        weight: [N] stored weight w (the effective scale is 1 + w).
        eps: variance epsilon.
        residual: optional [..., N] like x, added to x before the norm.

    Returns:
        (y, residual_out): y [..., N] in x.dtype; residual_out [..., N] is x + residual when a
        residual is given, else x itself.
    """
    if residual is not None:
        x = x + residual
    xf = x.float()
    y = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
    y = y * (1.0 + weight.float())
    return y.to(x.dtype), x


def rms_norm_quantize_fp8_ref(
    x: torch.Tensor,
    weight: torch.Tensor,
    eps: float,
    *,
    residual: torch.Tensor | None = None,
    row_multiple: int = CUBLAS_ROW_MULTIPLE,
) -> tuple[torch.Tensor, torch.Tensor, Fp8Activation]:
    """`rms_norm_ref`, then its output quantized per token and 128-column group to e4m3
    (`quantize_activation_fp8_ref`), for an FP8 linear after the norm.

    Args:
        x: [T, N] activations; weight, eps and residual as `rms_norm_ref`.
        row_multiple: the quantized rows are T rounded up to a multiple of it (zero rows past T).

    Returns:
        (y, residual_out, y_fp8): y [T, N] and residual_out as `rms_norm_ref`; y_fp8: e4m3
        [P, N] and scales [P, ceil(N/128)] fp32 with strides (1, P).
    """
    y, residual_out = rms_norm_ref(x, weight, eps, residual=residual)
    return y, residual_out, Fp8Activation(*quantize_activation_fp8_ref(y, row_multiple))


def gated_rms_norm_ref(
    x: torch.Tensor, z: torch.Tensor, weight: torch.Tensor, eps: float
) -> torch.Tensor:
    """Gated RMSNorm of the Gated-DeltaNet output: plain weight, norm first, then silu(z).

    Matches transformers' Qwen3_5RMSNormGated:
    y = (w * (x_f32 * rsqrt(mean(x^2) + eps)).to(x.dtype)) * silu(z_f32), cast to x.dtype.
    The product with w happens in the promoted dtype of w and x (bf16 for a bf16 weight).

    Args:
        x: [..., N] activations.
        z: [..., N] gate, same shape as x.
        weight: [N] plain scale w.
        eps: variance epsilon.

    Returns:
        y: [..., N] in x.dtype.
    """
    xf = x.float()
    normed = (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)).to(x.dtype)
    y = weight * normed
    y = y * F.silu(z.float())
    return y.to(x.dtype)
