"""`linear`: per shape, the fastest of the Triton skinny GEMM, the one-row GEMV and cuBLAS, from
the measured table; `linear_swiglu`: the MLP's gate_up projection and SwiGLU, in one launch for
one row where the table's kernel for the shape is the GEMV or a one-slice skinny tile.

Shapes absent from `shape_table`, rows beyond its largest bucket and CPU tensors go to torch
(cuBLAS on CUDA). Inside `invariant.batch_invariant(phase)` CUDA calls take that phase's fixed
kernel instead.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from sparkinfer.kernels.activation import silu_and_mul, silu_and_mul_ref
from sparkinfer.kernels.linear.gemv import GemvConfig, gemv
from sparkinfer.kernels.linear.invariant import current_phase, decode_config, invariant_linear
from sparkinfer.kernels.linear.shape_table import gemv_lookup, lookup
from sparkinfer.kernels.linear.skinny_gemm import SkinnyGemmConfig, skinny_gemm, split_k_slices


def linear(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """y = x @ weight.T, by whichever of the skinny GEMM, the GEMV (one row) and cuBLAS measured
    fastest for the shape.

    Args:
        x: [M, K] activations (bf16, fp16 or fp32), unit stride along K.
        weight: [N, K] weight in the checkpoint's layout, same dtype.

    Returns:
        y: [M, N] in x.dtype, accumulated in fp32.
    """
    if x.is_cuda and x.dim() == 2 and weight.dim() == 2:
        phase = current_phase()
        if phase is not None:
            return invariant_linear(x, weight, phase)
        one_row = _gemv_tile(x, weight)
        if one_row is not None:
            return gemv(x, weight, one_row)
        config = lookup(x.shape[0], weight.shape[0], weight.shape[1], x.dtype)
        if config is not None:
            return skinny_gemm(x, weight, config)
    if x.dtype != weight.dtype:
        raise TypeError(f"x and weight must share a dtype, got {x.dtype} and {weight.dtype}")
    return F.linear(x, weight)


def linear_swiglu(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """silu(gate) * up for [gate | up] = x @ weight.T: `linear` then `silu_and_mul`, bit for bit.

    For one row, where `linear` would run the GEMV or a one-slice skinny GEMM (the measured tile,
    or the decode tile of `batch_invariant("decode")`), one launch computes both halves and the
    activation. From two rows the tiles measured best hold twice the weight per pipeline stage
    when fused and ran slower end to end (docs/benchmarks.md), so those rows
    take the two launches; the bits are the same either way.

    Args:
        x: [M, K] activations (bf16, fp16 or fp32), unit stride along K.
        weight: [2 * I, K] gate_proj and up_proj stacked by rows, same dtype.

    Returns:
        y: [M, I] in x.dtype.
    """
    config = _one_slice_config(x, weight)
    if isinstance(config, GemvConfig):
        return gemv(x, weight, config, swiglu=True)
    if config is not None:
        return skinny_gemm(x, weight, config, swiglu=True)
    y = linear(x, weight)
    return silu_and_mul(y) if y.is_cuda else silu_and_mul_ref(y)


def _one_slice_config(
    x: torch.Tensor, weight: torch.Tensor
) -> GemvConfig | SkinnyGemmConfig | None:
    """For one row, the GEMV tile or the one-slice skinny tile `linear` would launch for this
    shape, else None."""
    is_one_row = x.is_cuda and x.dim() == 2 and x.shape[0] == 1  # see linear_swiglu
    phase = current_phase()
    if not is_one_row or weight.dim() != 2 or weight.shape[0] % 2 or phase == "prefill":
        return None
    one_row = _gemv_tile(x, weight) if phase is None else None
    if one_row is not None:
        return one_row
    (m, k), n = x.shape, weight.shape[0]
    config = decode_config(n, k, x.dtype) if phase == "decode" else lookup(m, n, k, x.dtype)
    if config is None or split_k_slices(k, config)[0] > 1:
        return None
    return config


def _gemv_tile(x: torch.Tensor, weight: torch.Tensor) -> GemvConfig | None:
    """The table's GEMV tile for a single row of x against a contiguous weight, else None."""
    if x.shape[0] != 1 or not weight.is_contiguous():
        return None
    return gemv_lookup(weight.shape[0], weight.shape[1], x.dtype)
