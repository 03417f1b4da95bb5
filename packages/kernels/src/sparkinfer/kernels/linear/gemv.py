"""One-row GEMV y = x @ weight.T: a single decode row against a large weight, without tensor cores.

Each program owns BN rows of the weight and streams them in [BN, BK] tiles of vector loads,
multiplies each by x's K tile in fp32 and keeps the products in a [BN, BK] accumulator, summed
along K once at the end. For one row this streams the weight faster than the skinny GEMM, whose
tl.dot pads the row to 16 and stages every tile through shared memory (docs/benchmarks.md), so
the shape table picks it per shape. With swiglu the program streams the matching up rows too and
stores silu(gate) * up, each half rounded first, as `linear` then `silu_and_mul` would.
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


@dataclass(frozen=True)
class GemvConfig:
    """Tile and launch parameters of one GEMV launch: BN weight rows per program, K tiles of BK."""

    BN: int = 8
    BK: int = 512
    num_warps: int = 4
    num_stages: int = 3


@triton.jit
def _gemv_kernel(
    p_x, p_w, p_y,
    N, K, K_PER_PROGRAM,
    BN: tl.constexpr, BK: tl.constexpr, SWIGLU: tl.constexpr, USE_PDL: tl.constexpr,
):  # fmt: skip
    # Keep this form when editing: an int64 K offset from the grid's second axis, a separately
    # passed K extent, the row stride taken from K and the weight loaded before x ran faster on
    # the H200, at every decode shape tried, than the same loop over range(0, K, BK) with an
    # explicit row stride.
    wait_for_prior_kernels(USE_PDL)
    i_n, i_k = tl.program_id(0), tl.program_id(1)
    o_n = i_n.to(tl.int64) * BN + tl.arange(0, BN)
    m_n = o_n < N
    k_start = i_k.to(tl.int64) * K_PER_PROGRAM
    b_acc = tl.zeros((BN, BK), dtype=tl.float32)
    b_up = tl.zeros((BN, BK), dtype=tl.float32)  # SWIGLU: the up rows, N below the gate rows
    for k0 in range(k_start, k_start + K_PER_PROGRAM, BK):
        o_k = k0 + tl.arange(0, BK)
        m_k = o_k < K
        m_wk = m_n[:, None] & m_k[None, :]
        p_wk = p_w + o_n[:, None] * K + o_k[None, :]
        b_w = tl.load(p_wk, mask=m_wk, other=0.0)
        if SWIGLU:
            b_wu = tl.load(p_wk + N * K, mask=m_wk, other=0.0)
        b_x = tl.load(p_x + o_k, mask=m_k, other=0.0).to(tl.float32)
        b_acc += b_w.to(tl.float32) * b_x[None, :]
        if SWIGLU:
            b_up += b_wu.to(tl.float32) * b_x[None, :]
    b_y = tl.sum(b_acc, axis=1)
    if SWIGLU:
        b_gate = b_y.to(p_y.dtype.element_ty).to(tl.float32)
        b_upy = tl.sum(b_up, axis=1).to(p_y.dtype.element_ty).to(tl.float32)
        b_y = silu_mul(b_gate, b_upy)
    tl.store(p_y + o_n, b_y.to(p_y.dtype.element_ty), mask=m_n)


def gemv(
    x: torch.Tensor,
    weight: torch.Tensor,
    config: GemvConfig | None = None,
    *,
    swiglu: bool = False,
) -> torch.Tensor:
    """y = x @ weight.T for one row of x, fp32 accumulate.

    Args:
        x: [1, K] activations (bf16, fp16 or fp32), unit stride along K.
        weight: [N, K] contiguous weight, same dtype.
        config: tile sizes; the default suits the 27B decode shapes.
        swiglu: weight is [gate | up] stacked by rows ([2 * I, K]); return silu(gate) * up
            [1, I] in the same launch.

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
    y = torch.empty((1, n), dtype=x.dtype, device=x.device)
    if n == 0:
        return y
    pdl = dependent_launch(x)
    _gemv_kernel[(triton.cdiv(n, cfg.BN), 1)](
        x, weight, y,
        n, k, k,
        BN=cfg.BN, BK=cfg.BK, SWIGLU=swiglu, USE_PDL=pdl,
        num_warps=cfg.num_warps, num_stages=cfg.num_stages, launch_pdl=pdl,
    )  # fmt: skip
    return y
