"""Fused RMSNorms: (1+w) RMSNorm with residual add, and the gated RMSNorm (norm, then silu(z)).

Rows are the last dim of an input viewed as [R1, R2, N] with any row strides and a unit last
stride, so per-head norms of a strided view (q_norm on the query part of qkv_proj's output) need no
copy. One program normalises BR rows held whole in registers.
"""

# Triton's annotations misread valid kernel code: num_warps/num_stages.
# pyright: reportCallIssue=false

from __future__ import annotations

import math

import torch
import triton
import triton.language as tl
from sparkinfer.kernels._triton import check_device
from sparkinfer.kernels.dependent_launch import dependent_launch, wait_for_prior_kernels
from sparkinfer.kernels.linear.invariant import current_phase

MAX_COLUMNS = 16384  # the widest row the norm kernels take
# Warps of a lone row's program (one decode sequence): the kernel is that one program's latency,
# and 32 warps ran the 27B decode step at one sequence 0.7% faster on an H200 than 8 (a row of
# 5120, docs/benchmarks.md). Inside `batch_invariant` every row keeps the batch's warps.
ONE_ROW_WARPS = 32
_FLOAT_DTYPES = (torch.float32, torch.float16, torch.bfloat16)


@triton.jit
def _row_offsets(i_r, R2, stride_r1, stride_r2, BR: tl.constexpr):
    """int64 offsets of rows i_r*BR .. i_r*BR+BR-1 of a [R1, R2, N] view, and their indices."""
    o_r = i_r.to(tl.int64) * BR + tl.arange(0, BR).to(tl.int64)
    return (o_r // R2) * stride_r1 + (o_r % R2) * stride_r2, o_r


@triton.jit
def _rms_norm_kernel(
    p_x, p_res, p_w, p_y, p_res_out,
    num_rows, R2, N, eps,
    stride_x1, stride_x2, stride_r1, stride_r2,
    HAS_RESIDUAL: tl.constexpr, BR: tl.constexpr, BN: tl.constexpr, USE_PDL: tl.constexpr,
):  # fmt: skip
    wait_for_prior_kernels(USE_PDL)
    norm_rows(
        p_x, p_res, p_w, p_y, p_res_out, tl.program_id(0),
        num_rows, R2, N, eps, stride_x1, stride_x2, stride_r1, stride_r2,
        HAS_RESIDUAL, BR, BN,
    )  # fmt: skip


@triton.jit
def norm_rows(
    p_x, p_res, p_w, p_y, p_res_out, i_r,
    num_rows, R2, N, eps, stride_x1, stride_x2, stride_r1, stride_r2,
    HAS_RESIDUAL: tl.constexpr, BR: tl.constexpr, BN: tl.constexpr,
):  # fmt: skip
    """Rows i_r*BR .. i_r*BR+BR-1 of `rms_norm`: y (and the residual sum) stored contiguous
    [num_rows, N]; kernels that fuse the norm call it, so their rows get the same bits."""
    o_x, o_r = _row_offsets(i_r, R2, stride_x1, stride_x2, BR)
    o_n = tl.arange(0, BN)
    m = (o_r < num_rows)[:, None] & (o_n < N)[None, :]
    b_x = tl.load(p_x + o_x[:, None] + o_n[None, :], mask=m, other=0.0)
    if HAS_RESIDUAL:
        o_res, _ = _row_offsets(i_r, R2, stride_r1, stride_r2, BR)
        b_res = tl.load(p_res + o_res[:, None] + o_n[None, :], mask=m, other=0.0)
        # The residual stream is summed in its own dtype, as in the reference.
        b_x = (b_x.to(tl.float32) + b_res.to(tl.float32)).to(p_y.dtype.element_ty)
        tl.store(p_res_out + o_r[:, None] * N + o_n[None, :], b_x, mask=m)
    b_xf = b_x.to(tl.float32)
    b_rstd = 1.0 / tl.sqrt(tl.sum(b_xf * b_xf, axis=1) / N + eps)
    b_w = tl.load(p_w + o_n, mask=o_n < N, other=0.0).to(tl.float32)
    b_y = b_xf * b_rstd[:, None] * (1.0 + b_w[None, :])
    tl.store(p_y + o_r[:, None] * N + o_n[None, :], b_y.to(p_y.dtype.element_ty), mask=m)


@triton.jit
def _gated_rms_norm_kernel(
    p_x, p_z, p_w, p_y,
    num_rows, R2, N, eps,
    stride_x1, stride_x2, stride_z1, stride_z2,
    ROUND_PRODUCT: tl.constexpr, BR: tl.constexpr, BN: tl.constexpr, USE_PDL: tl.constexpr,
):  # fmt: skip
    wait_for_prior_kernels(USE_PDL)
    i_r = tl.program_id(0)
    o_x, o_r = _row_offsets(i_r, R2, stride_x1, stride_x2, BR)
    o_z, _ = _row_offsets(i_r, R2, stride_z1, stride_z2, BR)
    o_n = tl.arange(0, BN)
    m = (o_r < num_rows)[:, None] & (o_n < N)[None, :]
    b_x = tl.load(p_x + o_x[:, None] + o_n[None, :], mask=m, other=0.0).to(tl.float32)
    b_z = tl.load(p_z + o_z[:, None] + o_n[None, :], mask=m, other=0.0).to(tl.float32)
    b_w = tl.load(p_w + o_n, mask=o_n < N, other=0.0).to(tl.float32)
    b_y = gated_norm_rows(b_x, b_z, b_w[None, :], N, eps, p_y.dtype.element_ty, ROUND_PRODUCT)
    tl.store(p_y + o_r[:, None] * N + o_n[None, :], b_y.to(p_y.dtype.element_ty), mask=m)


@triton.jit
def gated_norm_rows(b_x, b_z, b_w, N, eps, OUT_DTYPE: tl.constexpr, ROUND_PRODUCT: tl.constexpr):
    """The gated RMSNorm of fp32 rows b_x [..., BN] (zero past N) with gate b_z and weight b_w,
    in fp32, for a store in OUT_DTYPE; other kernels fuse it as their epilogue.

    The normed value is rounded to OUT_DTYPE before the weight, as transformers does;
    ROUND_PRODUCT rounds the product with the weight too (a 16-bit weight's promoted product).
    """
    b_rstd = 1.0 / tl.sqrt(tl.sum(b_x * b_x, axis=-1, keep_dims=True) / N + eps)
    b_y = b_w * (b_x * b_rstd).to(OUT_DTYPE).to(tl.float32)
    if ROUND_PRODUCT:
        b_y = b_y.to(OUT_DTYPE).to(tl.float32)
    return b_y * (b_z * tl.sigmoid(b_z))


def as_rows(t: torch.Tensor, name: str) -> torch.Tensor:
    """View t [..., N] as [R1, R2, N] without copying; raise if its layout does not allow it."""
    if t.dim() == 0:
        raise ValueError(f"{name} must have at least one dim, got a scalar")
    if t.stride(-1) != 1:
        raise ValueError(f"{name} must have unit stride in its last dim, got strides {t.stride()}")
    if t.dim() == 1:
        return t.view(1, 1, -1)
    try:
        return t.view(math.prod(t.shape[:-2]), t.shape[-2], t.shape[-1])
    except RuntimeError as err:
        raise ValueError(
            f"{name} with shape {tuple(t.shape)} and strides {t.stride()} cannot be viewed as "
            "[rows, heads, N]: make its leading dims contiguous"
        ) from err


def check_norm_operands(
    op: str, x: torch.Tensor, weight: torch.Tensor, name: str, other: torch.Tensor | None
) -> None:
    """Raise TypeError/ValueError unless x, its norm weight and `other` (named `name`: the
    residual or gate, or None) fit the norm kernels."""
    if x.dtype not in _FLOAT_DTYPES:
        raise TypeError(f"{op}: x must be float32, float16 or bfloat16, got {x.dtype}")
    if weight.dtype not in (x.dtype, torch.float32):
        raise TypeError(f"{op}: weight must be {x.dtype} or float32, got {weight.dtype}")
    if weight.shape != (x.shape[-1],) or weight.stride(0) != 1:
        raise ValueError(
            f"{op}: weight must be contiguous [{x.shape[-1]}] (x's last dim), got "
            f"{tuple(weight.shape)}"
        )
    if x.shape[-1] > MAX_COLUMNS:
        raise ValueError(f"{op}: last dim {x.shape[-1]} exceeds the kernel limit {MAX_COLUMNS}")
    tensors = {"x": x, "weight": weight} | ({name: other} if other is not None else {})
    check_device(op, tensors)
    if other is not None and (other.shape != x.shape or other.dtype != x.dtype):
        raise ValueError(
            f"{op}: {name} must match x: expected {tuple(x.shape)} {x.dtype}, "
            f"got {tuple(other.shape)} {other.dtype}"
        )


def norm_tiles(num_rows: int, n: int) -> tuple[int, int, int]:
    """(BR, BN, grid) with about 4K elements per program."""
    bn = triton.next_power_of_2(n)
    br = max(1, min(4096 // bn, triton.next_power_of_2(num_rows)))
    return br, bn, triton.cdiv(num_rows, br)


def rms_norm_warps(num_rows: int, bn: int) -> int:
    """Warps of an `rms_norm` program of BN columns; kernels that fuse the norm take the same, so
    their rows sum in the same order."""
    if num_rows == 1 and bn >= 4096 and current_phase() is None:
        return ONE_ROW_WARPS
    return 4 if bn <= 2048 else 8


def rms_norm(
    x: torch.Tensor,
    weight: torch.Tensor,
    eps: float,
    *,
    residual: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Zero-centred RMSNorm y = x * rsqrt(mean(x^2) + eps) * (1 + w), with an optional residual add.

    Args:
        x: [..., N] activations (bf16, fp16 or fp32), unit last stride.
        weight: [N] stored weight w (x.dtype or fp32); the effective scale is 1 + w.
        eps: variance epsilon.
        residual: optional [..., N] like x, added to x (in x.dtype) before the norm.

    Returns:
        (y, residual_out): y [..., N] contiguous in x.dtype; residual_out is the new contiguous
        residual stream x + residual when a residual is given, else x itself.
    """
    check_norm_operands("rms_norm", x, weight, "residual", residual)
    x3 = as_rows(x, "x")
    res3 = as_rows(residual, "residual") if residual is not None else x3
    num_rows, n = x3.shape[0] * x3.shape[1], x3.shape[2]
    y = torch.empty(x.shape, dtype=x.dtype, device=x.device)
    res_out = torch.empty(x.shape, dtype=x.dtype, device=x.device) if residual is not None else x
    if num_rows == 0:
        return y, res_out
    br, bn, grid = norm_tiles(num_rows, n)
    num_warps = rms_norm_warps(num_rows, bn)
    pdl = dependent_launch(x)
    _rms_norm_kernel[(grid,)](
        x3, res3, weight, y, res_out,
        num_rows, x3.shape[1], n, eps,
        x3.stride(0), x3.stride(1), res3.stride(0), res3.stride(1),
        HAS_RESIDUAL=residual is not None, BR=br, BN=bn, USE_PDL=pdl,
        num_warps=num_warps, launch_pdl=pdl,
    )  # fmt: skip
    return y, res_out


def rounds_weight_product(weight: torch.Tensor, x: torch.Tensor) -> bool:
    """Whether the gated norm's product with its weight is rounded (a 16-bit promoted dtype)."""
    return torch.promote_types(weight.dtype, x.dtype) != torch.float32


def gated_rms_norm(
    x: torch.Tensor, z: torch.Tensor, weight: torch.Tensor, eps: float
) -> torch.Tensor:
    """Gated RMSNorm: y = (w * norm(x).to(dtype)) * silu(z), cast to x.dtype (plain weight).

    Args:
        x: [..., N] activations, unit last stride.
        z: [..., N] gate, same shape and dtype as x, unit last stride.
        weight: [N] plain scale w (x.dtype or fp32).
        eps: variance epsilon.

    Returns:
        y: [..., N] contiguous in x.dtype.
    """
    check_norm_operands("gated_rms_norm", x, weight, "z", z)
    x3, z3 = as_rows(x, "x"), as_rows(z, "z")
    num_rows, n = x3.shape[0] * x3.shape[1], x3.shape[2]
    y = torch.empty(x.shape, dtype=x.dtype, device=x.device)
    if num_rows == 0:
        return y
    br, bn, grid = norm_tiles(num_rows, n)
    round_product = rounds_weight_product(weight, x)
    pdl = dependent_launch(x)
    _gated_rms_norm_kernel[(grid,)](
        x3, z3, weight, y,
        num_rows, x3.shape[1], n, eps,
        x3.stride(0), x3.stride(1), z3.stride(0), z3.stride(1),
        ROUND_PRODUCT=round_product, BR=br, BN=bn, USE_PDL=pdl,
        num_warps=4 if bn <= 2048 else 8, launch_pdl=pdl,
    )  # fmt: skip
    return y
