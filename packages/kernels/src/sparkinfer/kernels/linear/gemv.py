"""One-row GEMV y = x @ weight.T: a single decode row against a large weight, without tensor cores.

Each program owns BN rows of the weight and streams them in [BN, BK] tiles of vector loads,
multiplies each by x's K tile in fp32 and keeps the products in a [BN, BK] accumulator, summed
along K once at the end. For one row this streams the weight faster than the skinny GEMM, whose
tl.dot pads the row to 16 and stages every tile through shared memory (docs/benchmarks.md), so
the shape table picks it per shape. With swiglu the program streams the matching up rows too and
stores silu(gate) * up, each half rounded first, as `linear` then `silu_and_mul` would.

The GEMV can also norm x on the way in (`norm`), so a decode step skips the norm's own launch;
x is a register vector here, so the norm costs a few more loads of the row from L2:
- RowNorm, the (1+w) RMSNorm over the row with an optional residual add: the program multiplies
  the weight by (x + residual) * (1 + w), sums the squares of x + residual on the way, and scales
  its sums by rsqrt(mean(x^2) + eps) at the end (the two launches round the normed row to bf16
  first, so the last bits may differ); the first program stores x + residual, the new residual.
- HeadGatedNorm, the gated RMSNorm over heads of D channels: each head of a K tile is normed and
  gated by silu(z) as `gated_rms_norm` does, rounded, then multiplied.
"""

# Triton's annotations misread valid kernel code: num_warps/num_stages, constexpr branches.
# pyright: reportCallIssue=false, reportPossiblyUnboundVariable=false

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl
from sparkinfer.kernels.activation.fused import silu_mul
from sparkinfer.kernels.dependent_launch import dependent_launch, wait_for_prior_kernels
from sparkinfer.kernels.linear._checks import check_gemm_operands
from sparkinfer.kernels.linear.gemm_norms import (
    HEAD_GATED_NORM_ID,
    ROW_NORM_ID,
    HeadGatedNorm,
    RowNorm,
    norm_operands,
)

ROW_NORM = tl.constexpr(ROW_NORM_ID)
HEAD_GATED_NORM = tl.constexpr(HEAD_GATED_NORM_ID)


@dataclass(frozen=True)
class GemvConfig:
    """Tile and launch parameters of one GEMV launch: BN weight rows per program, K tiles of BK."""

    BN: int = 8
    BK: int = 512
    num_warps: int = 4
    num_stages: int = 3


@triton.jit
def _x_tile(
    p_x, p_res, p_nw, p_z, o_k, m_k, eps,
    Y_DTYPE: tl.constexpr, NORM: tl.constexpr, HAS_RESIDUAL: tl.constexpr,
    ROUND_PRODUCT: tl.constexpr, BK: tl.constexpr, HEAD_DIM: tl.constexpr,
):  # fmt: skip
    """x's K tile as the GEMV multiplies it (fp32), and the row before the norm's weight."""
    b_x = tl.load(p_x + o_k, mask=m_k, other=0.0).to(tl.float32)
    b_h = b_x
    if NORM == ROW_NORM:
        if HAS_RESIDUAL:  # the residual stream is summed in its own dtype, as in rms_norm
            b_r = tl.load(p_res + o_k, mask=m_k, other=0.0).to(tl.float32)
            b_h = (b_x + b_r).to(Y_DTYPE).to(tl.float32)
        b_x = b_h * (1.0 + tl.load(p_nw + o_k, mask=m_k, other=0.0).to(tl.float32))
    elif NORM == HEAD_GATED_NORM:
        b_heads = tl.reshape(b_x, (BK // HEAD_DIM, HEAD_DIM))
        b_rstd = 1.0 / tl.sqrt(tl.sum(b_heads * b_heads, axis=1) / HEAD_DIM + eps)
        b_n = (b_heads * b_rstd[:, None]).to(Y_DTYPE).to(tl.float32)
        b_g = tl.load(p_nw + tl.arange(0, HEAD_DIM)).to(tl.float32)[None, :] * b_n
        if ROUND_PRODUCT:
            b_g = b_g.to(Y_DTYPE).to(tl.float32)
        b_z = tl.load(p_z + o_k, mask=m_k, other=0.0).to(tl.float32)
        b_x = (tl.reshape(b_g, (BK,)) * (b_z * tl.sigmoid(b_z))).to(Y_DTYPE).to(tl.float32)
    return b_x, b_h


@triton.jit
def _store_residual(p_x, p_res, p_res_out, K, BK: tl.constexpr):
    """residual_out = x + residual over the row, summed in their dtype as `rms_norm` does."""
    for k0 in range(0, K, BK):
        o_k = k0 + tl.arange(0, BK)
        m_k = o_k < K
        b_r = tl.load(p_x + o_k, mask=m_k, other=0.0).to(tl.float32)
        b_r += tl.load(p_res + o_k, mask=m_k, other=0.0).to(tl.float32)
        tl.store(p_res_out + o_k, b_r.to(p_res_out.dtype.element_ty), mask=m_k)


@triton.jit
def _gemv_kernel(
    p_x, p_w, p_y, p_res, p_res_out, p_nw, p_z,
    N, K, K_PER_PROGRAM, eps,
    BN: tl.constexpr, BK: tl.constexpr, SWIGLU: tl.constexpr, NORM: tl.constexpr,
    HAS_RESIDUAL: tl.constexpr, ROUND_PRODUCT: tl.constexpr, HEAD_DIM: tl.constexpr,
    USE_PDL: tl.constexpr,
):  # fmt: skip
    # This form (an int64 K offset from the grid's second axis, a separately passed K extent,
    # the weight's row stride taken from K, weight loads before x's) measured 5-35% faster on
    # the H200 than the same loop over range(0, K, BK) with an explicit row stride.
    wait_for_prior_kernels(USE_PDL)
    i_n, i_k = tl.program_id(0), tl.program_id(1)
    o_n = i_n.to(tl.int64) * BN + tl.arange(0, BN)
    m_n = o_n < N
    k_start = i_k.to(tl.int64) * K_PER_PROGRAM
    y_dtype = p_y.dtype.element_ty
    b_acc = tl.zeros((BN, BK), dtype=tl.float32)
    b_up = tl.zeros((BN, BK), dtype=tl.float32)  # SWIGLU: the up rows, N below the gate rows
    b_ss = tl.zeros((BK,), dtype=tl.float32)  # ROW_NORM: the squares of the row
    for k0 in range(k_start, k_start + K_PER_PROGRAM, BK):
        o_k = k0 + tl.arange(0, BK)
        m_k = o_k < K
        m_wk = m_n[:, None] & m_k[None, :]
        p_wk = p_w + o_n[:, None] * K + o_k[None, :]
        b_w = tl.load(p_wk, mask=m_wk, other=0.0)
        if SWIGLU:
            b_wu = tl.load(p_wk + N * K, mask=m_wk, other=0.0)
        b_x, b_h = _x_tile(
            p_x, p_res, p_nw, p_z, o_k, m_k, eps,
            y_dtype, NORM, HAS_RESIDUAL, ROUND_PRODUCT, BK, HEAD_DIM,
        )  # fmt: skip
        b_ss += b_h * b_h
        b_acc += b_w.to(tl.float32) * b_x[None, :]
        if SWIGLU:
            b_up += b_wu.to(tl.float32) * b_x[None, :]
    b_y = tl.sum(b_acc, axis=1)
    b_upy = tl.sum(b_up, axis=1)
    if NORM == ROW_NORM:
        b_rstd = 1.0 / tl.sqrt(tl.sum(b_ss, axis=0) / K + eps)
        b_y *= b_rstd
        b_upy *= b_rstd
        if HAS_RESIDUAL:  # noqa: SIM102 (a compile-time branch around a run-time one)
            if i_n == 0:  # one program stores the new residual stream, after its own sums
                _store_residual(p_x, p_res, p_res_out, K, BK)
    if SWIGLU:
        b_gate = b_y.to(y_dtype).to(tl.float32)
        b_y = silu_mul(b_gate, b_upy.to(y_dtype).to(tl.float32))
    tl.store(p_y + o_n, b_y.to(y_dtype), mask=m_n)


def gemv(
    x: torch.Tensor,
    weight: torch.Tensor,
    config: GemvConfig | None = None,
    *,
    swiglu: bool = False,
    norm: RowNorm | HeadGatedNorm | None = None,
) -> torch.Tensor:
    """y = x @ weight.T for one row of x, fp32 accumulate.

    Args:
        x: [1, K] activations (bf16, fp16 or fp32), unit stride along K.
        weight: [N, K] contiguous weight, same dtype.
        config: tile sizes; the default suits the 27B decode shapes.
        swiglu: weight is [gate | up] stacked by rows ([2 * I, K]); return silu(gate) * up
            [1, I] in the same launch.
        norm: norm x on the way in (module docstring).

    Returns:
        y: [1, N] contiguous in x.dtype ([1, N / 2] with swiglu).
    """
    check_gemm_operands("gemv", x, weight)
    cfg = config or GemvConfig()
    (m, k), n = x.shape, weight.shape[0]
    if m != 1:
        raise ValueError(f"gemv: x must be one row [1, K], got {m} rows: use skinny_gemm")
    if not weight.is_contiguous():
        raise ValueError(f"gemv: weight must be contiguous, got strides {weight.stride()}")
    if swiglu:
        if n % 2:
            raise ValueError(f"gemv: swiglu needs an even weight height, got N={n}")
        n //= 2
    res, res_out, nw, z, eps, kind, round_product, head_dim = norm_operands(x, norm, cfg.BK)
    y = torch.empty((1, n), dtype=x.dtype, device=x.device)
    if n == 0:
        return y
    pdl = dependent_launch(x)
    _gemv_kernel[(triton.cdiv(n, cfg.BN), 1)](
        x, weight, y, res, res_out, nw, z,
        n, k, k, eps,
        BN=cfg.BN, BK=cfg.BK, SWIGLU=swiglu, NORM=kind, HAS_RESIDUAL=res is not x,
        ROUND_PRODUCT=round_product, HEAD_DIM=head_dim, USE_PDL=pdl,
        num_warps=cfg.num_warps, num_stages=cfg.num_stages, launch_pdl=pdl,
    )  # fmt: skip
    return y
