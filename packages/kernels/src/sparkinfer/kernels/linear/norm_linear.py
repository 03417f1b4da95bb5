"""A norm then a linear layer, in one skinny-GEMM launch for decode rows where the tile allows.

`rms_norm_linear` is the decoder layer's (1+w) RMSNorm with residual add feeding the mixer's input
projection or the MLP's gate_up projection; `gated_rms_norm_linear` is Gated-DeltaNet's gated
norm feeding out_proj. At decode each norm is a launch of a few microseconds that reads a few
kilobytes; inside the GEMM it costs nothing the weight stream does not hide.

Fused (skinny_gemm's `norm`) for rows where the shape table's tile for the shape is the skinny
GEMM with one K slice (row norm) or with K tiles of one head (gated norm); the row norm also takes
the skinny tile of the largest smaller bucket when cuBLAS won the row count's own bucket by less
than the norm's launch costs. Elsewhere (prefill, CPU, `batch_invariant`) the norm kernel runs,
then `linear`. Fused, the row norm's rsqrt scales the fp32 accumulator instead of each bf16
input, so the last bits may differ from the two launches (within the GEMM's own rounding).
"""

from __future__ import annotations

import torch
from sparkinfer.kernels.activation import silu_and_mul
from sparkinfer.kernels.linear.dispatch import linear, linear_swiglu
from sparkinfer.kernels.linear.gemm_norms import HeadGatedNorm, RowNorm
from sparkinfer.kernels.linear.invariant import current_phase
from sparkinfer.kernels.linear.ref import gated_rms_norm_linear_ref, rms_norm_linear_ref
from sparkinfer.kernels.linear.shape_table import M_BUCKETS, lookup, m_bucket
from sparkinfer.kernels.linear.skinny_gemm import SkinnyGemmConfig, skinny_gemm, split_k_slices
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
    config = _row_norm_config(x, weight, swiglu)
    if config is None:
        if not x.is_cuda:
            return rms_norm_linear_ref(
                x, norm_weight, eps, weight, residual=residual, swiglu=swiglu
            )
        h, residual_out = rms_norm(x, norm_weight, eps, residual=residual)
        return (linear_swiglu(h, weight) if swiglu else linear(h, weight)), residual_out
    residual_out = (
        x if residual is None else torch.empty_like(x, memory_format=torch.contiguous_format)
    )
    norm = RowNorm(norm_weight, eps, residual, None if residual is None else residual_out)
    fuse_swiglu = swiglu and x.shape[0] == 1  # see linear_swiglu for why one row only
    y = skinny_gemm(x, weight, config, swiglu=fuse_swiglu, norm=norm)
    return (silu_and_mul(y) if swiglu and not fuse_swiglu else y), residual_out


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
    config = _head_norm_config(m, weight, d, x.dtype)
    if config is None or not x.is_contiguous() or z.stride(1) != d or z.stride(2) != 1:
        return linear(gated_rms_norm(x, z, norm_weight, eps).view(m, heads * d), weight)
    z2 = z.as_strided((m, heads * d), (z.stride(0), 1))
    return skinny_gemm(
        x.view(m, heads * d), weight, config, norm=HeadGatedNorm(norm_weight, eps, z2)
    )


def _row_norm_config(
    x: torch.Tensor, weight: torch.Tensor, swiglu: bool
) -> SkinnyGemmConfig | None:
    """The one-slice skinny tile the row norm fuses into, or None for the two launches."""
    if not x.is_cuda or x.dim() != 2 or weight.dim() != 2 or current_phase() is not None:
        return None
    (m, k), n = x.shape, weight.shape[0]
    bucket = m_bucket(m)
    if bucket is None or (swiglu and n % 2):
        return None
    # Where cuBLAS won the rows' own bucket by less than a norm launch (32 rows of gate_up and
    # in_proj, docs/benchmarks.md), the next smaller bucket's tile runs.
    i = M_BUCKETS.index(bucket)
    config = lookup(bucket, n, k, x.dtype) or (
        lookup(M_BUCKETS[i - 1], n, k, x.dtype) if i else None
    )
    if config is None or split_k_slices(k, config)[0] > 1:
        return None
    return config


def _head_norm_config(
    m: int, weight: torch.Tensor, head_dim: int, dtype: torch.dtype
) -> SkinnyGemmConfig | None:
    """The table's skinny tile for these rows when its K tiles are whole heads, else None."""
    if current_phase() is not None or weight.dim() != 2:
        return None
    config = lookup(m, weight.shape[0], weight.shape[1], dtype)
    if config is None or head_dim != config.BK or weight.shape[1] % head_dim:
        return None
    return config
