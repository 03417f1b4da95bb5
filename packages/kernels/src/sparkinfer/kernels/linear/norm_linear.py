"""A norm then a linear layer, in one GEMV launch for a single decode row.

`rms_norm_linear` is the decoder layer's (1+w) RMSNorm with residual add feeding the mixer's input
projection or the MLP's gate_up projection; `gated_rms_norm_linear` is Gated-DeltaNet's gated
norm feeding out_proj. At one stream each norm is its own launch of a few microseconds that reads
a few kilobytes; inside the GEMV (`gemv`'s `norm`) it costs a few more loads from L2.

Fused for one row on CUDA outside `batch_invariant`, with the table's GEMV tile for the shape, or
the default tile where the GEMV lost to another kernel by less than a norm launch costs. Elsewhere
(several rows, prefill, CPU, the batch-invariant mode) the norm kernel runs, then `linear`. Fused,
the row norm's rsqrt scales the fp32 sums instead of each input, so the last bits may differ from
the two launches (within the GEMM's own rounding).
"""

from __future__ import annotations

import torch
from sparkinfer.kernels.linear.dispatch import linear, linear_swiglu
from sparkinfer.kernels.linear.gemm_norms import HeadGatedNorm, RowNorm
from sparkinfer.kernels.linear.gemv import GemvConfig, gemv
from sparkinfer.kernels.linear.invariant import current_phase
from sparkinfer.kernels.linear.ref import gated_rms_norm_linear_ref, rms_norm_linear_ref
from sparkinfer.kernels.linear.shape_table import gemv_lookup
from sparkinfer.kernels.rms_norm import gated_rms_norm, rms_norm


def rms_norm_linear(
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
    if not x.is_cuda:
        return rms_norm_linear_ref(x, norm_weight, eps, weight, residual=residual, swiglu=swiglu)
    config = _one_row_tile(x, weight)
    if config is None:
        h, residual_out = rms_norm(x, norm_weight, eps, residual=residual)
        return (linear_swiglu(h, weight) if swiglu else linear(h, weight)), residual_out
    residual_out = x if residual is None else torch.empty_like(x)
    norm = RowNorm(norm_weight, eps, residual, None if residual is None else residual_out)
    return gemv(x, weight, config, swiglu=swiglu, norm=norm), residual_out


def gated_rms_norm_linear(
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
    if not x.is_cuda:
        return gated_rms_norm_linear_ref(x, z, norm_weight, eps, weight)
    m, heads, d = x.shape
    fusable = x.is_contiguous() and z.stride(1) == d and z.stride(2) == 1 and not d & (d - 1)
    config = _one_row_tile(x.view(m, heads * d), weight) if fusable else None
    if config is None or config.BK % d:
        return linear(gated_rms_norm(x, z, norm_weight, eps).reshape(m, heads * d), weight)
    z_row = z.as_strided((1, heads * d), (z.stride(0), 1))
    norm = HeadGatedNorm(norm_weight, eps, z_row)
    return gemv(x.view(1, heads * d), weight, config, norm=norm)


def _one_row_tile(x: torch.Tensor, weight: torch.Tensor) -> GemvConfig | None:
    """The GEMV tile a norm fuses into for this call, or None for the norm's own launch."""
    is_one_row = x.dim() == 2 and x.shape[0] == 1 and x.stride(1) == 1
    if not is_one_row or weight.dim() != 2 or not weight.is_contiguous():
        return None
    if current_phase() is not None or weight.dtype != x.dtype or weight.shape[1] != x.shape[1]:
        return None
    return gemv_lookup(weight.shape[0], weight.shape[1], x.dtype) or GemvConfig()
