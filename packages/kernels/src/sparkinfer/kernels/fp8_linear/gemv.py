"""One-row FP8 GEMV y = x @ W.T: a single bf16 decode row against a block-scaled e4m3 weight.

The decode GEMM pads one row to a 16-row dot tile and gives each program 64 weight rows, so at
one row a launch has too few programs to keep the memory system busy. This kernel streams the
weight as the bf16 GEMV does: each program owns BN weight rows and walks K in [BN, BK] tiles of
vector loads (no tensor cores), multiplying each e4m3 tile, converted to fp32 (exact), by x's
K tile times the tile's block scales, and sums along K once at the end. Every product is scaled
once, in fp32, as in the decode GEMM; the sum order differs, so the batch-invariant mode, which
needs one kernel for every row count, keeps the decode GEMM.
"""

# Triton's annotations misread valid kernel code: num_warps/num_stages.
# pyright: reportCallIssue=false

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl
from sparkinfer.kernels.fp8_linear._checks import check_fp8_operands
from sparkinfer.kernels.fp8_linear.ref import BLOCK


@dataclass(frozen=True)
class Fp8GemvConfig:
    """Tiles of one GEMV launch: BN weight rows per program, K tiles of BK."""

    BN: int = 8
    BK: int = 512
    num_warps: int = 4
    num_stages: int = 3


@triton.jit
def _fp8_gemv_kernel(
    p_x, p_w, p_s, p_y,
    N, K, num_k_blocks,
    BN: tl.constexpr, BK: tl.constexpr, SCALE_ROWS: tl.constexpr, SCALE_K: tl.constexpr,
):  # fmt: skip
    i_n = tl.program_id(0)
    o_n = i_n.to(tl.int64) * BN + tl.arange(0, BN).to(tl.int64)
    m_n = o_n < N
    p_sn = p_s + (o_n // SCALE_ROWS) * num_k_blocks  # each weight row's row of scales
    b_acc = tl.zeros((BN, BK), dtype=tl.float32)
    for k0 in range(0, K, BK):
        o_k = k0 + tl.arange(0, BK).to(tl.int64)
        m_k = o_k < K
        m_wk = m_n[:, None] & m_k[None, :]
        b_w = tl.load(p_w + o_n[:, None] * K + o_k[None, :], mask=m_wk, other=0.0)
        b_x = tl.load(p_x + o_k, mask=m_k, other=0.0).to(tl.float32)
        b_s = tl.load(p_sn[:, None] + (o_k // SCALE_K)[None, :], mask=m_wk, other=0.0)
        b_acc += b_w.to(tl.float32) * (b_s * b_x[None, :])
    b_y = tl.sum(b_acc, axis=1)
    tl.store(p_y + o_n, b_y.to(p_y.dtype.element_ty), mask=m_n)


def fp8_gemv(
    x: torch.Tensor,
    weight: torch.Tensor,
    weight_scale_inv: torch.Tensor,
    config: Fp8GemvConfig | None = None,
) -> torch.Tensor:
    """y = x @ W.T for one row of x and the block-scaled e4m3 weight W, fp32 accumulate.

    Args:
        x: [1, K] activations (bf16, fp16 or fp32), unit stride along K.
        weight: [N, K] float8_e4m3fn, contiguous.
        weight_scale_inv: [ceil(N/128), ceil(K/128)] (or [N, ceil(K/128)]) fp32, contiguous.
        config: tiles; BK must be a multiple of 128 or divide it.

    Returns:
        y: [1, N] contiguous in x.dtype.
    """
    rows_per_scale = check_fp8_operands("fp8_gemv", x, weight, weight_scale_inv)
    cfg = config or Fp8GemvConfig()
    if cfg.BK % BLOCK and BLOCK % cfg.BK:
        raise ValueError(f"fp8_gemv: BK is {cfg.BK}; it must be a multiple of {BLOCK} or divide it")
    (m, k), n = x.shape, weight.shape[0]
    if m != 1:
        raise ValueError(f"fp8_gemv: x must be one row [1, K], got {m} rows: use fp8_gemm_decode")
    y = torch.empty((1, n), dtype=x.dtype, device=x.device)
    if n == 0:
        return y
    if k == 0:
        return y.zero_()
    _fp8_gemv_kernel[(triton.cdiv(n, cfg.BN),)](
        x, weight, weight_scale_inv, y,
        n, k, weight_scale_inv.shape[1],
        BN=cfg.BN, BK=cfg.BK, SCALE_ROWS=rows_per_scale, SCALE_K=BLOCK,
        num_warps=cfg.num_warps, num_stages=cfg.num_stages,
    )  # fmt: skip
    return y
