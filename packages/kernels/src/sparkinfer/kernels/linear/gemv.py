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
from sparkinfer.kernels.causal_conv1d.fused import conv_step
from sparkinfer.kernels.dependent_launch import dependent_launch, wait_for_prior_kernels
from sparkinfer.kernels.linear._checks import ConvUpdate, check_gemm_operands


@dataclass(frozen=True)
class GemvConfig:
    """Tile and launch parameters of one GEMV launch: BN weight rows per program, K tiles of BK."""

    BN: int = 8
    BK: int = 512
    num_warps: int = 4
    num_stages: int = 3


@triton.jit
def _gemv_kernel(
    p_x, p_w, p_y, p_cw, p_cs, p_slots,
    N, K, K_PER_PROGRAM, CONV_C, stride_cw,
    BN: tl.constexpr, BK: tl.constexpr, SWIGLU: tl.constexpr, CONV_W: tl.constexpr,
    USE_PDL: tl.constexpr,
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
    b_y = b_y.to(p_y.dtype.element_ty)
    if CONV_W > 0:  # noqa: SIM102 (a constexpr test, then a runtime one)
        if i_n * BN < CONV_C:  # the columns of the first CONV_C take the conv's decode step
            slot = tl.load(p_slots).to(tl.int64)
            m_conv = m_n & (o_n < CONV_C) & (o_n * 0 + slot >= 0)  # a tensor mask
            p_state = p_cs + slot * (CONV_W - 1) * CONV_C + o_n
            b_conv = conv_step(b_y, p_state, p_cw + o_n * stride_cw, m_conv, CONV_C, CONV_W)
            b_conv = tl.where(slot >= 0, b_conv, 0.0).to(p_y.dtype.element_ty)
            b_y = tl.where(o_n < CONV_C, b_conv, b_y)
    tl.store(p_y + o_n, b_y, mask=m_n)


def gemv(
    x: torch.Tensor,
    weight: torch.Tensor,
    config: GemvConfig | None = None,
    *,
    swiglu: bool = False,
    conv: ConvUpdate | None = None,
) -> torch.Tensor:
    """y = x @ weight.T for one row of x, fp32 accumulate.

    Args:
        x: [1, K] activations (bf16, fp16 or fp32), unit stride along K.
        weight: [N, K] contiguous weight, same dtype.
        config: tile sizes; the default suits the 27B decode shapes.
        swiglu: weight is [gate | up] stacked by rows ([2 * I, K]); return silu(gate) * up
            [1, I] in the same launch.
        conv: the first conv.channels columns of y then take one decode step of the causal
            conv and SiLU in the same launch (`causal_conv1d_update` on y's rounded columns, its
            window updated in place); not with swiglu.

    Returns:
        y: [1, N] contiguous in x.dtype ([1, N / 2] with swiglu).
    """
    check_gemm_operands("gemv", x, weight)
    if conv is not None:
        conv.check("gemv", x, weight, swiglu=swiglu)
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
    cw, cs, slots = (conv.weight, conv.state, conv.state_slots) if conv else (y, y, y)
    _gemv_kernel[(triton.cdiv(n, cfg.BN), 1)](
        x, weight, y, cw, cs, slots,
        n, k, k, conv.channels if conv else 0, cw.stride(0),
        BN=cfg.BN, BK=cfg.BK, SWIGLU=swiglu, CONV_W=conv.width if conv else 0, USE_PDL=pdl,
        num_warps=cfg.num_warps, num_stages=cfg.num_stages, launch_pdl=pdl,
    )  # fmt: skip
    return y
