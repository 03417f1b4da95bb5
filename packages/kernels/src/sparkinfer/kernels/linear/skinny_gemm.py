"""Skinny GEMM y = x @ weight.T for decode-shaped x (a few rows) against a large weight.

The weight is streamed once: each program owns BN output columns and one of SPLIT_K slices of K,
holds all rows of x in a BM-row tile and accumulates in fp32 with tl.dot. With SPLIT_K > 1 the
slices write fp32 partials that a second kernel sums in slice order, so results never depend on
scheduling (no atomics).
"""

# Triton's annotations misread valid kernel code: num_warps/num_stages, tl.static_range.
# pyright: reportCallIssue=false, reportGeneralTypeIssues=false

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl
from sparkinfer.kernels._triton import dot_dtype
from sparkinfer.kernels.dependent_launch import dependent_launch, wait_for_prior_kernels
from sparkinfer.kernels.linear._checks import check_gemm_operands


@dataclass(frozen=True)
class SkinnyGemmConfig:
    """Tile sizes and launch parameters of one skinny GEMM launch.

    BM: rows per program; None sizes it from M (16..64). A fixed BM keeps one dot shape for every
    row count, so a row's value never depends on how many rows share the launch.
    """

    BM: int | None = None
    BN: int = 64
    BK: int = 128
    SPLIT_K: int = 1
    num_warps: int = 4
    num_stages: int = 3


@triton.jit
def _skinny_gemm_kernel(
    p_x, p_w, p_out,
    M, N, K, K_PER_SPLIT,
    stride_xm, stride_wn, stride_om,
    BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr, DOT_DTYPE: tl.constexpr,
    USE_PDL: tl.constexpr,
):  # fmt: skip
    wait_for_prior_kernels(USE_PDL)
    # Row tiles vary fastest: the programs of one weight tile run together and share it in L2.
    i_m, i_n, i_k = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    o_m = i_m.to(tl.int64) * BM + tl.arange(0, BM).to(tl.int64)
    o_n = i_n.to(tl.int64) * BN + tl.arange(0, BN).to(tl.int64)
    m_m, m_n = o_m < M, o_n < N
    k_start = i_k.to(tl.int64) * K_PER_SPLIT
    k_end = tl.minimum(k_start + K_PER_SPLIT, K)
    b_acc = tl.zeros((BM, BN), dtype=tl.float32)
    for k0 in range(k_start, k_end, BK):
        o_k = k0 + tl.arange(0, BK).to(tl.int64)
        m_k = o_k < k_end
        m_xk = m_m[:, None] & m_k[None, :]
        m_wk = m_n[:, None] & m_k[None, :]
        b_x = tl.load(p_x + o_m[:, None] * stride_xm + o_k[None, :], mask=m_xk, other=0.0)
        b_w = tl.load(p_w + o_n[:, None] * stride_wn + o_k[None, :], mask=m_wk, other=0.0)
        b_acc = tl.dot(b_x.to(DOT_DTYPE), tl.trans(b_w.to(DOT_DTYPE)), b_acc)
    # [SPLIT_K, M, N] fp32 partials, or [M, N] output when there is a single slice.
    p_o = p_out + i_k.to(tl.int64) * M * N + o_m[:, None] * stride_om + o_n[None, :]
    tl.store(p_o, b_acc.to(p_out.dtype.element_ty), mask=m_m[:, None] & m_n[None, :])


@triton.jit
def _split_k_reduce_kernel(
    p_part, p_y, MN, SPLIT_K: tl.constexpr, BLOCK: tl.constexpr, USE_PDL: tl.constexpr
):
    wait_for_prior_kernels(USE_PDL)
    o = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK).to(tl.int64)
    m = o < MN
    b_acc = tl.zeros((BLOCK,), dtype=tl.float32)
    # Slices are summed in index order: the result does not depend on launch order.
    for s in tl.static_range(SPLIT_K):
        b_acc += tl.load(p_part + s * MN + o, mask=m, other=0.0)
    tl.store(p_y + o, b_acc.to(p_y.dtype.element_ty), mask=m)


def skinny_gemm(
    x: torch.Tensor, weight: torch.Tensor, config: SkinnyGemmConfig | None = None
) -> torch.Tensor:
    """y = x @ weight.T with the Triton skinny GEMM, fp32 accumulate.

    Args:
        x: [M, K] activations (bf16, fp16 or fp32), unit stride along K.
        weight: [N, K] weight, same dtype, unit stride along K.
        config: tile sizes; the default suits small shapes.

    Returns:
        y: [M, N] contiguous in x.dtype.
    """
    check_gemm_operands("skinny_gemm", x, weight)
    cfg = config or SkinnyGemmConfig()
    (m, k), n = x.shape, weight.shape[0]
    y = torch.empty((m, n), dtype=x.dtype, device=x.device)
    if m == 0 or n == 0:
        return y
    bm = cfg.BM or max(16, min(64, triton.next_power_of_2(m)))
    split_k = max(1, min(cfg.SPLIT_K, triton.cdiv(k, cfg.BK)))
    k_per_split = triton.cdiv(triton.cdiv(k, split_k), cfg.BK) * cfg.BK
    split_k = triton.cdiv(k, k_per_split) if k else 1
    out = y if split_k == 1 else torch.empty((split_k, m, n), dtype=torch.float32, device=x.device)
    grid = (triton.cdiv(m, bm), triton.cdiv(n, cfg.BN), split_k)
    pdl = dependent_launch(x)
    _skinny_gemm_kernel[grid](
        x, weight, out,
        m, n, k, k_per_split,
        x.stride(0), weight.stride(0), n,
        BM=bm, BN=cfg.BN, BK=cfg.BK, DOT_DTYPE=dot_dtype(x), USE_PDL=pdl,
        num_warps=cfg.num_warps, num_stages=cfg.num_stages, launch_pdl=pdl,
    )  # fmt: skip
    if split_k > 1:
        block = 1024
        _split_k_reduce_kernel[(triton.cdiv(m * n, block),)](
            out, y, m * n, SPLIT_K=split_k, BLOCK=block, USE_PDL=pdl, num_warps=4, launch_pdl=pdl
        )
    return y
