"""One-row FP8 GEMV y = x @ W.T: a single bf16 decode row against a block-scaled e4m3 weight.

The decode GEMM pads one row to a 16-row dot tile and gives each program 64 weight rows, so at
one row a launch has too few programs to keep the memory system busy. This kernel streams the
weight as the bf16 GEMV does: each program owns BN weight rows and walks K in [BN, BK] tiles of
vector loads (no tensor cores). Each thread sums its own 16-column run of a row against x in fp32
(the e4m3 -> fp16 -> fp32 conversion is exact), then scales the run's sum by the row's block
scale, so a weight element costs its conversion and one FMA and the scales are read once per
row and 128-column block, not per element. SPLIT_K cuts K into slices run by separate programs
(`_split_k`, a deterministic reduction) for the projections with few rows. BF16_BITS converts
the weight by bit moves on the integer and FMA pipes (`_e4m3`, exact; then bf16 -> fp32 is a
shift) instead of the two conversions e4m3 -> fp16 -> fp32 per element, which at one row can
hold the kernel below the copy rate (the conversion unit issues fewer elements per clock than
HBM delivers); the sums are the same. The sum order differs
from the decode GEMM's, so the batch-invariant mode, which needs one kernel for every row count,
keeps the decode GEMM.
"""

# Triton's annotations misread valid kernel code: num_warps/num_stages.
# pyright: reportCallIssue=false, reportAssignmentType=false

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl
from sparkinfer.kernels.fp8_linear._checks import check_fp8_operands
from sparkinfer.kernels.fp8_linear._e4m3 import e4m3_to_bf16
from sparkinfer.kernels.fp8_linear._split_k import split_k_buffers, store_or_reduce
from sparkinfer.kernels.fp8_linear.ref import BLOCK
from sparkinfer.kernels.split_k import split_k_plan


@dataclass(frozen=True)
class Fp8GemvConfig:
    """Tiles of one GEMV launch: BN weight rows per program, K tiles of BK (a multiple of 128 or
    a divisor of it), K cut into at most SPLIT_K slices run by separate programs, the weight
    converted by bit moves (BF16_BITS, CUDA only) or through fp16."""

    BN: int = 16
    BK: int = 256
    SPLIT_K: int = 1
    num_warps: int = 4
    num_stages: int = 3
    BF16_BITS: bool = False


@triton.jit
def _fp8_gemv_kernel(
    p_x, p_w, p_s, p_y, p_part, p_arrived,
    N, K, num_k_blocks, K_PER_SPLIT,
    BN: tl.constexpr, BK: tl.constexpr, SCALE_ROWS: tl.constexpr, SCALE_K: tl.constexpr,
    SPLIT_K: tl.constexpr, BF16_BITS: tl.constexpr,
):  # fmt: skip
    # The tile is [BN, NB, NC, VEC]: NB scale blocks of BB = min(BK, 128) columns, each cut in
    # NC runs of VEC (one thread's vector load). A run is summed alone (one FMA per element),
    # then scaled by its block's scale: each weight element costs its conversion and one FMA,
    # and the scales are read once per row and block, not per element.
    VEC: tl.constexpr = 16 if BK >= 16 else BK
    BB: tl.constexpr = BK if BK < SCALE_K else SCALE_K
    NB: tl.constexpr = BK // BB
    NC: tl.constexpr = BB // VEC
    i_n, i_k = tl.program_id(0), tl.program_id(1)
    o_n = i_n.to(tl.int64) * BN + tl.arange(0, BN).to(tl.int64)
    m_n = o_n < N
    o_b = tl.arange(0, NB)
    o_kt = (  # [NB, NC, VEC]: each element's column in the tile
        (o_b * BB)[:, None, None]
        + (tl.arange(0, NC) * VEC)[None, :, None]
        + tl.arange(0, VEC)[None, None, :]
    )
    k_start = i_k.to(tl.int64) * K_PER_SPLIT
    k_end = tl.minimum(k_start + K_PER_SPLIT, K)
    p_sn = p_s + (o_n // SCALE_ROWS) * num_k_blocks  # each weight row's row of scales
    b_acc = tl.zeros((BN, NB, NC), dtype=tl.float32)
    for k0 in range(k_start, k_end, BK):
        o_k = k0 + o_kt
        m_k = o_k < k_end
        m_wk = m_n[:, None, None, None] & m_k[None, :, :, :]
        p_wk = p_w + o_n[:, None, None, None] * K + o_k[None, :, :, :]
        b_w = tl.load(p_wk, mask=m_wk, other=0.0)
        b_x = tl.load(p_x + o_k, mask=m_k, other=0.0).to(tl.float32)
        i_blk = k0 // SCALE_K + o_b * BB // SCALE_K  # [NB] scale columns
        m_s = m_n[:, None] & (i_blk < num_k_blocks)[None, :]
        b_s = tl.load(p_sn[:, None] + i_blk[None, :], mask=m_s, other=0.0)  # [BN, NB]
        # exact either way: e4m3 values are bf16 and fp16 values
        b_wf = e4m3_to_bf16(b_w).to(tl.float32) if BF16_BITS else b_w.to(tl.float32)
        b_run = tl.sum(b_wf * b_x[None, :, :, :], axis=3)  # [BN, NB, NC]
        b_acc += b_run * b_s[:, :, None]
    b_y = tl.sum(tl.sum(b_acc, axis=2), axis=1)
    store_or_reduce(p_y, p_part, p_arrived, b_y, o_n, m_n, i_n, i_k, N, SPLIT_K)


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
    num_slices, k_per_split = split_k_plan(k, cfg.SPLIT_K, cfg.BK)
    grid = (triton.cdiv(n, cfg.BN), num_slices)
    part, arrived = split_k_buffers("fp8_gemv", y, num_slices, grid[0])
    _fp8_gemv_kernel[grid](
        x, weight, weight_scale_inv, y, part, arrived,
        n, k, weight_scale_inv.shape[1], k_per_split,
        BN=cfg.BN, BK=cfg.BK, SCALE_ROWS=rows_per_scale, SCALE_K=BLOCK, SPLIT_K=num_slices,
        BF16_BITS=cfg.BF16_BITS and x.is_cuda, num_warps=cfg.num_warps, num_stages=cfg.num_stages,
    )  # fmt: skip
    return y
