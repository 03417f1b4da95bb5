"""Plain-torch linear layer without bias, with the SwiGLU after it, and with a norm before it: the
specifications of `linear`, `linear_swiglu`, `rms_norm_linear` and `gated_rms_norm_linear`."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from sparkinfer.kernels.activation import silu_and_mul_ref
from sparkinfer.kernels.rms_norm import gated_rms_norm_ref, rms_norm_ref


def linear_ref(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """y = x @ weight.T, accumulated in fp32.

    Args:
        x: [M, K] activations (bf16 or fp32).
        weight: [N, K] weight in the checkpoint's layout, same dtype as x.

    Returns:
        y: [M, N] in x.dtype.
    """
    return (x.float() @ weight.float().T).to(x.dtype)


def linear_swiglu_ref(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """silu(gate) * up for [gate | up] = x @ weight.T.

    Args:
        x: [M, K] activations (bf16, fp16 or fp32), unit stride along K.
        weight: [2 * I, K] gate_proj and up_proj stacked by rows, same dtype.

    Returns:
        y: [M, I] in x.dtype.
    """
    return silu_and_mul_ref(linear_ref(x, weight))


def rms_norm_linear_ref(
    x: torch.Tensor,
    norm_weight: torch.Tensor,
    eps: float,
    weight: torch.Tensor,
    *,
    residual: torch.Tensor | None = None,
    swiglu: bool = False,
) -> tuple[torch.Tensor, torch.Tensor]:
    """y = linear(rms_norm(x, norm_weight, eps, residual=residual)[0], weight), SwiGLU'd if asked.

    Args:
        x: [M, K] activations (bf16, fp16 or fp32), unit stride along K.
        norm_weight: [K] zero-centred norm weight w (the scale is 1 + w).
        eps: the norm's variance epsilon.
        weight: [N, K] projection weight, x's dtype ([gate | up] stacked by rows with swiglu).
        residual: optional [M, K] like x, added to x before the norm.
        swiglu: return silu(gate) * up [M, N / 2] of the projection, as `linear_swiglu`.

    Returns:
        (y, residual_out): y [M, N] (or [M, N / 2]) in x.dtype; residual_out the new residual
        stream x + residual, or x itself without a residual.
    """
    h, residual_out = rms_norm_ref(x, norm_weight, eps, residual=residual)
    y = F.linear(h, weight)  # torch's GEMM, as the model's CPU path runs its Linear layers
    return (silu_and_mul_ref(y) if swiglu else y), residual_out


def gated_rms_norm_linear_ref(
    x: torch.Tensor,
    z: torch.Tensor,
    norm_weight: torch.Tensor,
    eps: float,
    weight: torch.Tensor,
) -> torch.Tensor:
    """y = linear(gated_rms_norm(x, z, norm_weight, eps) over heads, weight).

    Args:
        x: [M, H, D] activations, heads of D channels, contiguous.
        z: [M, H, D] gate like x, unit stride along D and heads D apart (a view of a wider row).
        norm_weight: [D] plain norm weight shared by the heads.
        eps: the norm's variance epsilon.
        weight: [N, H * D] projection weight, x's dtype.

    Returns:
        y: [M, N] in x.dtype.
    """
    h = gated_rms_norm_ref(x, z, norm_weight, eps)
    return F.linear(h.reshape(x.shape[0], -1), weight)
