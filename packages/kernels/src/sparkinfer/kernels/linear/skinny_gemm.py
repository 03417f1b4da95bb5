"""Skinny GEMM y = x @ weight.T for decode-shaped x (a few rows) against a large weight.

The weight is streamed once: each program owns BN output columns and one of SPLIT_K slices of K,
holds all rows of x in a BM-row tile and accumulates in fp32 with tl.dot. With SWAP_AB the weight
tile is the dot's first operand (the accumulator is [BN, BM]): the tensor cores' wide side then
spans BN weight rows and x's few rows take the narrow side, which streamed the wide decode
projections faster at 8 and 32 rows on the H200 (docs/benchmarks.md). With SPLIT_K > 1 the
slices write fp32 partials, and the last slice of each output tile to finish (elected by an arrival
counter) sums every slice's partial in slice order: results never depend on scheduling, and no
second kernel runs. With TMA (Hopper and later) x's and the weight's tiles come through tensor
descriptors instead of masked pointer loads: the copy engine zero-fills past M, N and K, and
streamed the 16-32-row decode projections a few percent faster on the H200 (the shape table
names the shapes).
"""

# Triton's annotations misread valid kernel code: num_warps/num_stages, tl.static_range.
# pyright: reportCallIssue=false, reportGeneralTypeIssues=false

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl
from sparkinfer.kernels._triton import dot_dtype, tma_aligned, tma_device_error
from sparkinfer.kernels.activation.fused import silu_mul
from sparkinfer.kernels.dependent_launch import dependent_launch, wait_for_prior_kernels
from sparkinfer.kernels.linear._checks import check_gemm_operands
from sparkinfer.kernels.split_k import MAX_TILES, arrival_counters_for, split_k_plan
from triton.tools.tensor_descriptor import TensorDescriptor


@dataclass(frozen=True)
class SkinnyGemmConfig:
    """Tile sizes and launch parameters of one skinny GEMM launch.

    BM: rows per program; None sizes it from M (16..64). A fixed BM keeps one dot shape for every
    row count, so a row's value never depends on how many rows share the launch.
    SWAP_AB: the weight tile is the dot's first operand (accumulator [BN, BM]).
    """

    BM: int | None = None
    BN: int = 64
    BK: int = 128
    SPLIT_K: int = 1
    num_warps: int = 4
    num_stages: int = 3
    SWAP_AB: bool = False
    TMA: bool = False


@triton.jit
def _zero_tile(BM: tl.constexpr, BN: tl.constexpr, SWAP_AB: tl.constexpr):
    """An fp32 accumulator: [BN, BM] with SWAP_AB, else [BM, BN]."""
    if SWAP_AB:
        return tl.zeros((BN, BM), dtype=tl.float32)
    else:
        return tl.zeros((BM, BN), dtype=tl.float32)


@triton.jit
def _tile_dot(b_x, b_w, b_acc, DOT_DTYPE: tl.constexpr, SWAP_AB: tl.constexpr):
    """b_acc + x [BM, BK] @ w [BN, BK].T, or its transpose w @ x.T with SWAP_AB."""
    if SWAP_AB:
        return tl.dot(b_w.to(DOT_DTYPE), tl.trans(b_x.to(DOT_DTYPE)), b_acc)
    else:
        return tl.dot(b_x.to(DOT_DTYPE), tl.trans(b_w.to(DOT_DTYPE)), b_acc)


@triton.jit
def _tile_offsets(o_m, o_n, m_m, m_n, N, SWAP_AB: tl.constexpr):
    """Offsets into a contiguous [M, N] output and their mask, laid out as the accumulator."""
    if SWAP_AB:
        return o_m[None, :] * N + o_n[:, None], m_m[None, :] & m_n[:, None]
    else:
        return o_m[:, None] * N + o_n[None, :], m_m[:, None] & m_n[None, :]


@triton.jit
def _skinny_gemm_kernel(
    p_x, p_w, desc_x, desc_w, p_y, p_part, p_arrived,
    M, N, K, K_PER_SPLIT,
    stride_xm, stride_wn,
    BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr, SPLIT_K: tl.constexpr,
    SWAP_AB: tl.constexpr, SWIGLU: tl.constexpr, TMA: tl.constexpr, DOT_DTYPE: tl.constexpr,
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
    b_acc = _zero_tile(BM, BN, SWAP_AB)
    b_up = _zero_tile(BM, BN, SWAP_AB)  # SWIGLU: the up rows, N below the gate rows
    if TMA:  # whole BK tiles (K_PER_SPLIT is a multiple of BK); zeros past M, N and K
        k_lo = i_k * K_PER_SPLIT  # int32 descriptor offsets
        for k0 in range(k_lo, tl.minimum(k_lo + K_PER_SPLIT, K), BK):
            b_x = desc_x.load([i_m * BM, k0])
            b_w = desc_w.load([i_n * BN, k0])
            b_acc = _tile_dot(b_x, b_w, b_acc, DOT_DTYPE, SWAP_AB)
    else:
        for k0 in range(k_start, k_end, BK):
            o_k = k0 + tl.arange(0, BK).to(tl.int64)
            m_k = o_k < k_end
            m_xk = m_m[:, None] & m_k[None, :]
            m_wk = m_n[:, None] & m_k[None, :]
            b_x = tl.load(p_x + o_m[:, None] * stride_xm + o_k[None, :], mask=m_xk, other=0.0)
            p_wk = p_w + o_n[:, None] * stride_wn + o_k[None, :]
            b_w = tl.load(p_wk, mask=m_wk, other=0.0)
            b_acc = _tile_dot(b_x, b_w, b_acc, DOT_DTYPE, SWAP_AB)
            if SWIGLU:
                b_wu = tl.load(p_wk + N * stride_wn, mask=m_wk, other=0.0)
                b_up = _tile_dot(b_x, b_wu, b_up, DOT_DTYPE, SWAP_AB)
    # y is [M, N] contiguous, partials [SPLIT_K, M, N]; the tiles below are elementwise.
    o_mn, m_mn = _tile_offsets(o_m, o_n, m_m, m_n, N, SWAP_AB)
    if SWIGLU:
        # Both halves rounded to y's dtype first, as the GEMM then silu_and_mul would.
        b_gate = b_acc.to(p_y.dtype.element_ty).to(tl.float32)
        b_up = b_up.to(p_y.dtype.element_ty).to(tl.float32)
        tl.store(p_y + o_mn, silu_mul(b_gate, b_up).to(p_y.dtype.element_ty), mask=m_mn)
    elif SPLIT_K == 1:
        tl.store(p_y + o_mn, b_acc.to(p_y.dtype.element_ty), mask=m_mn)
    else:
        tl.store(p_part + i_k.to(tl.int64) * M * N + o_mn, b_acc, mask=m_mn)
        tl.debug_barrier()  # every thread's partial precedes the release below
        p_tile = p_arrived + i_m * tl.num_programs(1) + i_n
        if tl.atomic_add(p_tile, 1, sem="acq_rel") == SPLIT_K - 1:
            # The last slice to arrive sums the slices in index order, whichever slice it is.
            b_sum = _zero_tile(BM, BN, SWAP_AB)
            for s in tl.static_range(SPLIT_K):
                p_s = p_part + s * M * N + o_mn
                b_sum += tl.load(p_s, mask=m_mn, other=0.0, cache_modifier=".cg")
            tl.store(p_y + o_mn, b_sum.to(p_y.dtype.element_ty), mask=m_mn)
            tl.store(p_tile, 0)  # every slice has arrived: ready for the next launch


def split_k_slices(k: int, config: SkinnyGemmConfig) -> tuple[int, int]:
    """(slices, K per slice) a launch over K with `config` runs: at most SPLIT_K, whole BK tiles."""
    return split_k_plan(k, config.SPLIT_K, config.BK)


def skinny_gemm(
    x: torch.Tensor,
    weight: torch.Tensor,
    config: SkinnyGemmConfig | None = None,
    *,
    swiglu: bool = False,
) -> torch.Tensor:
    """y = x @ weight.T with the Triton skinny GEMM, fp32 accumulate.

    Args:
        x: [M, K] activations (bf16, fp16 or fp32), unit stride along K.
        weight: [N, K] weight, same dtype, unit stride along K.
        config: tile sizes; the default suits small shapes.
        swiglu: weight is [gate | up] stacked by rows ([2 * I, K]); return silu(gate) * up
            [M, I] in the same launch, each half rounded to x.dtype first (what the GEMM then
            `silu_and_mul` computes). Needs a config with one K slice.

    Returns:
        y: [M, N] contiguous in x.dtype ([M, N / 2] with swiglu).
    """
    check_gemm_operands("skinny_gemm", x, weight)
    cfg = config or SkinnyGemmConfig()
    (m, k), n = x.shape, weight.shape[0]
    split_k, k_per_split = split_k_slices(k, cfg)
    if swiglu:
        if n % 2 or split_k > 1:
            raise ValueError(
                f"skinny_gemm: swiglu needs an even weight height and one K slice, got N={n} "
                f"and {split_k} slices: use SPLIT_K=1, or linear then silu_and_mul"
            )
        n //= 2
    y = torch.empty((m, n), dtype=x.dtype, device=x.device)
    if m == 0 or n == 0:
        return y
    bm = cfg.BM or max(16, min(64, triton.next_power_of_2(m)))
    part, arrived = y, y  # not read with one slice
    grid = (triton.cdiv(m, bm), triton.cdiv(n, cfg.BN), split_k)
    if split_k > 1:
        if grid[0] * grid[1] > MAX_TILES:
            raise ValueError(
                f"skinny_gemm: {grid[0] * grid[1]} output tiles exceed {MAX_TILES}; "
                "use a wider BN or SPLIT_K=1"
            )
        part = torch.empty((split_k, m, n), dtype=torch.float32, device=x.device)
        arrived = arrival_counters_for(x.device)
    use_tma = (cfg.TMA and not swiglu and tma_device_error(x) is None
               and all(tma_aligned(t, t.stride(0)) for t in (x, weight)))  # fmt: skip
    desc_x, desc_w = x, weight  # not read without TMA
    if use_tma:
        desc_x = TensorDescriptor(x, [m, k], [x.stride(0), 1], [bm, cfg.BK])
        desc_w = TensorDescriptor(weight, [weight.shape[0], k], [weight.stride(0), 1],
                                  [cfg.BN, cfg.BK])  # fmt: skip
    pdl = dependent_launch(x)
    _skinny_gemm_kernel[grid](
        x, weight, desc_x, desc_w, y, part, arrived,
        m, n, k, k_per_split,
        x.stride(0), weight.stride(0),
        BM=bm, BN=cfg.BN, BK=cfg.BK, SPLIT_K=split_k, SWAP_AB=cfg.SWAP_AB, SWIGLU=swiglu,
        TMA=use_tma, DOT_DTYPE=dot_dtype(x), USE_PDL=pdl,
        num_warps=cfg.num_warps, num_stages=cfg.num_stages, launch_pdl=pdl,
    )  # fmt: skip
    return y
