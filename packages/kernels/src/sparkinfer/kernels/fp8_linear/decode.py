"""Decode-shaped FP8 GEMM y = x @ W.T: a few bf16 rows against a block-scaled e4m3 weight.

The weight is streamed once, at one byte per element: each program owns BN output columns and a
BM-row tile of x and walks K in BK steps (BK divides 128, so a step lies in one scale block). It
converts the e4m3 tile to x's dtype (exact: every e4m3 value is a bf16 value), takes the tile's
dot with x in fp32 and adds it times the block's scale of each column, so every product is
scaled exactly once, in fp32. Activations stay in x's dtype: decode is bound by the weight's
bytes, not by the tensor cores, so quantizing them would only lose precision.
"""

# Triton's annotations misread valid kernel code: num_warps/num_stages.
# pyright: reportCallIssue=false, reportArgumentType=false

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl
from sparkinfer.kernels._triton import dot_dtype
from sparkinfer.kernels.fp8_linear._checks import check_fp8_operands
from sparkinfer.kernels.fp8_linear._e4m3 import e4m3_to_bf16
from sparkinfer.kernels.fp8_linear._split_k import split_k_buffers, store_or_reduce
from sparkinfer.kernels.fp8_linear.ref import BLOCK
from sparkinfer.kernels.split_k import split_k_plan


@dataclass(frozen=True)
class Fp8DecodeConfig:
    """Tiles of one decode launch: BM rows of x, BN weight rows per program, BK along K.

    BM None sizes the row tile from M (16, 32 or 64); a fixed BM keeps one tile shape for every
    row count, which the batch-invariant mode needs. SPLIT_K > 1 cuts K into at most that many
    slices run by separate programs (`_split_k`: deterministic, but a different sum order).
    BF16_BITS converts the weight to bf16 by bit moves instead of through fp16 (`_e4m3`; bf16
    x on CUDA only, else ignored): the same values, off the conversion unit.
    """

    BM: int | None = None
    BN: int = 64
    BK: int = 128
    num_warps: int = 4
    num_stages: int = 4
    SPLIT_K: int = 1
    BF16_BITS: bool = False


@triton.jit
def _fp8_decode_kernel(
    p_x, p_w, p_s, p_y, p_part, p_arrived,
    M, N, K, stride_xm, num_k_blocks, K_PER_SPLIT,
    BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr, SCALE_ROWS: tl.constexpr,
    SCALE_K: tl.constexpr, DOT_DTYPE: tl.constexpr, SPLIT_K: tl.constexpr,
    BF16_BITS: tl.constexpr,
):  # fmt: skip
    i_m, i_n, i_k = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    o_m = i_m.to(tl.int64) * BM + tl.arange(0, BM).to(tl.int64)
    o_n = i_n.to(tl.int64) * BN + tl.arange(0, BN).to(tl.int64)
    m_m, m_n = o_m < M, o_n < N
    p_sn = p_s + (o_n // SCALE_ROWS) * num_k_blocks  # each column's row of scales
    k_start = i_k.to(tl.int64) * K_PER_SPLIT
    k_end = tl.minimum(k_start + K_PER_SPLIT, K)
    b_acc = tl.zeros((BM, BN), dtype=tl.float32)
    for k0 in range(k_start, k_end, BK):
        o_k = k0 + tl.arange(0, BK).to(tl.int64)
        m_k = o_k < k_end
        b_w = tl.load(
            p_w + o_n[:, None] * K + o_k[None, :], mask=m_n[:, None] & m_k[None, :], other=0.0
        )
        b_x = tl.load(
            p_x + o_m[:, None] * stride_xm + o_k[None, :],
            mask=m_m[:, None] & m_k[None, :],
            other=0.0,
        )
        b_s = tl.load(p_sn + k0 // SCALE_K, mask=m_n, other=0.0)  # [BN] fp32
        b_wd = e4m3_to_bf16(b_w) if BF16_BITS else b_w.to(DOT_DTYPE)
        b_dot = tl.dot(b_x.to(DOT_DTYPE), tl.trans(b_wd))
        b_acc += b_dot * b_s[None, :]
    o_y = o_m[:, None] * N + o_n[None, :]
    m_y = m_m[:, None] & m_n[None, :]
    i_tile = i_m * tl.num_programs(1) + i_n
    store_or_reduce(p_y, p_part, p_arrived, b_acc, o_y, m_y, i_tile, i_k, M * N, SPLIT_K)


def decode_row_tile(num_rows: int) -> int:
    """Rows of x per program for a batch: the smallest of 16, 32, 64 holding it (64 beyond)."""
    return next((b for b in (16, 32) if num_rows <= b), 64)


def fp8_gemm_decode(
    x: torch.Tensor,
    weight: torch.Tensor,
    weight_scale_inv: torch.Tensor,
    config: Fp8DecodeConfig | None = None,
) -> torch.Tensor:
    """y = x @ W.T for a few rows of x and the block-scaled e4m3 weight W, fp32 accumulate.

    Args:
        x: [M, K] activations (bf16, fp16 or fp32), unit stride along K; best for M <= 64.
        weight: [N, K] float8_e4m3fn, contiguous.
        weight_scale_inv: [ceil(N/128), ceil(K/128)] (or [N, ceil(K/128)]) fp32, contiguous.
        config: tiles; BK must divide 128. With SPLIT_K > 1 the rows' sums run in another
            order, so the batch-invariant mode keeps one slice.

    Returns:
        y: [M, N] contiguous in x.dtype.
    """
    rows_per_scale = check_fp8_operands("fp8_gemm_decode", x, weight, weight_scale_inv)
    cfg = config or Fp8DecodeConfig()
    if BLOCK % cfg.BK:
        raise ValueError(f"fp8_gemm_decode: BK is {cfg.BK}; it must divide {BLOCK}")
    (m, k), n = x.shape, weight.shape[0]
    y = torch.empty((m, n), dtype=x.dtype, device=x.device)
    if m == 0 or n == 0:
        return y
    if k == 0:
        return y.zero_()
    bm = cfg.BM or decode_row_tile(m)
    num_slices, k_per_split = split_k_plan(k, cfg.SPLIT_K, cfg.BK)
    grid = (triton.cdiv(m, bm), triton.cdiv(n, cfg.BN), num_slices)
    part, arrived = split_k_buffers("fp8_gemm_decode", y, num_slices, grid[0] * grid[1])
    _fp8_decode_kernel[grid](
        x, weight, weight_scale_inv, y, part, arrived,
        m, n, k, x.stride(0), weight_scale_inv.shape[1], k_per_split,
        BM=bm, BN=cfg.BN, BK=cfg.BK, SCALE_ROWS=rows_per_scale, SCALE_K=BLOCK,
        DOT_DTYPE=dot_dtype(x), SPLIT_K=num_slices,
        BF16_BITS=cfg.BF16_BITS and x.is_cuda and x.dtype == torch.bfloat16,
        num_warps=cfg.num_warps, num_stages=cfg.num_stages,
    )  # fmt: skip
    return y
