"""Tiled GEMM y = x @ weight.T for prefill-shaped x (many rows), one fixed tile for every M.

Each program owns one BM x BN output tile and walks K in BK steps from 0 to K, accumulating in
fp32 with tl.dot; there is no split-K. With the tile fixed, an output row's value depends only
on that row of x and the weight, never on how many rows share the launch or where the row sits:
the batch-invariant counterpart of cuBLAS, whose kernel choice changes with M. Programs are
ordered in groups of GROUP_M row tiles so neighbouring programs share weight tiles in L2. With
TMA (Hopper and later, 16-byte aligned operands) the tiles of x and the weight come through
tensor descriptors, which zero-fill past M, N and K, and the output tile leaves through one; the
sums are the same per row whatever M is, as with the pointer loads.
"""

# Triton's annotations misread valid kernel code: num_warps/num_stages launch arguments.
# pyright: reportCallIssue=false

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl
from sparkinfer.kernels._triton import dot_dtype, tma_aligned, tma_device_error
from sparkinfer.kernels.linear._checks import check_gemm_operands
from triton.tools.tensor_descriptor import TensorDescriptor


@dataclass(frozen=True)
class TiledGemmConfig:
    """Tile sizes and launch parameters of one tiled GEMM launch."""

    BM: int = 128
    BN: int = 128
    BK: int = 64
    GROUP_M: int = 8
    num_warps: int = 8
    num_stages: int = 4
    TMA: bool = False  # descriptor loads and stores where the device and operands allow


@triton.jit
def _tiled_gemm_kernel(
    p_x, p_w, p_y, desc_x, desc_w, desc_y,
    M, N, K,
    stride_xm, stride_wn, stride_ym,
    BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr, GROUP_M: tl.constexpr,
    DOT_DTYPE: tl.constexpr, TMA: tl.constexpr,
):  # fmt: skip
    pid = tl.program_id(0)
    num_m, num_n = tl.cdiv(M, BM), tl.cdiv(N, BN)
    per_group = GROUP_M * num_n
    first_m = (pid // per_group) * GROUP_M
    group_rows = tl.minimum(num_m - first_m, GROUP_M)
    i_m = first_m + (pid % per_group) % group_rows
    i_n = (pid % per_group) // group_rows

    b_acc = tl.zeros((BM, BN), dtype=tl.float32)
    if TMA:
        for k0 in range(0, K, BK):
            b_x = desc_x.load([i_m * BM, k0])
            b_w = desc_w.load([i_n * BN, k0])
            b_acc = tl.dot(b_x.to(DOT_DTYPE), tl.trans(b_w.to(DOT_DTYPE)), b_acc)
        desc_y.store([i_m * BM, i_n * BN], b_acc.to(p_y.dtype.element_ty))
        return
    o_m = i_m.to(tl.int64) * BM + tl.arange(0, BM).to(tl.int64)
    o_n = i_n.to(tl.int64) * BN + tl.arange(0, BN).to(tl.int64)
    m_m, m_n = o_m < M, o_n < N
    for k0 in range(0, K, BK):
        o_k = k0 + tl.arange(0, BK).to(tl.int64)
        m_k = o_k < K
        b_x = tl.load(
            p_x + o_m[:, None] * stride_xm + o_k[None, :], mask=m_m[:, None] & m_k[None, :],
            other=0.0,
        )  # fmt: skip
        b_w = tl.load(
            p_w + o_n[:, None] * stride_wn + o_k[None, :], mask=m_n[:, None] & m_k[None, :],
            other=0.0,
        )  # fmt: skip
        b_acc = tl.dot(b_x.to(DOT_DTYPE), tl.trans(b_w.to(DOT_DTYPE)), b_acc)
    p_o = p_y + o_m[:, None] * stride_ym + o_n[None, :]
    tl.store(p_o, b_acc.to(p_y.dtype.element_ty), mask=m_m[:, None] & m_n[None, :])


def tiled_gemm(
    x: torch.Tensor, weight: torch.Tensor, config: TiledGemmConfig | None = None
) -> torch.Tensor:
    """y = x @ weight.T with one fixed tile for every row count, fp32 accumulate.

    Args:
        x: [M, K] activations (bf16, fp16 or fp32), unit stride along K.
        weight: [N, K] weight, same dtype, unit stride along K.
        config: tile sizes; keep one config per (N, K) for batch-invariant rows.

    Returns:
        y: [M, N] contiguous in x.dtype.
    """
    check_gemm_operands("tiled_gemm", x, weight)
    cfg = config or TiledGemmConfig()
    (m, k), n = x.shape, weight.shape[0]
    y = torch.empty((m, n), dtype=x.dtype, device=x.device)
    if m == 0 or n == 0:
        return y
    if k == 0:
        return y.zero_()
    grid = (triton.cdiv(m, cfg.BM) * triton.cdiv(n, cfg.BN),)
    use_tma = (cfg.TMA and tma_device_error(x) is None
               and all(tma_aligned(t, t.stride(0)) for t in (x, weight, y)))  # fmt: skip
    descs = (x, weight, y)  # not read without TMA
    if use_tma:
        descs = (
            TensorDescriptor(x, [m, k], [x.stride(0), 1], [cfg.BM, cfg.BK]),
            TensorDescriptor(weight, [n, k], [weight.stride(0), 1], [cfg.BN, cfg.BK]),
            TensorDescriptor(y, [m, n], [n, 1], [cfg.BM, cfg.BN]),
        )
    _tiled_gemm_kernel[grid](
        x, weight, y, *descs,
        m, n, k,
        x.stride(0), weight.stride(0), n,
        BM=cfg.BM, BN=cfg.BN, BK=cfg.BK, GROUP_M=cfg.GROUP_M, DOT_DTYPE=dot_dtype(x),
        TMA=use_tma, num_warps=cfg.num_warps, num_stages=cfg.num_stages,
    )  # fmt: skip
    return y
