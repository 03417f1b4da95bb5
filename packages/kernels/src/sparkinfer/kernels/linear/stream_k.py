"""Stream-K skinny GEMM y = x @ weight.T: every program streams the same share of the weight.

The skinny GEMM gives each program whole output tiles (or whole K slices of them), so a decode
projection's 40-544 column tiles fill the H200's 132 SMs in uneven waves: 80 tiles of the 5120 x
17408 down projection keep 52 SMs idle, 544 tiles of gate_up leave a last wave of 16. Here the
(column tile, K step) iterations are laid end to end and cut into equal contiguous ranges, a few
per SM; a program walks its range tile by tile. A tile covered by one program is stored directly;
the programs sharing a tile write fp32 partials and the last to arrive (an arrival counter per
tile, as the split-K skinny GEMM keeps) sums them in K order, so results never depend on
scheduling. x holds at most one row tile (decode batches); the weight tile is the dot's first
operand (SWAP_AB), as in the skinny GEMM's descriptor (TMA) tiles the table picks for 8-32 rows.
"""

# Triton's annotations misread valid kernel code: num_warps/num_stages, constexpr branches and
# arguments.
# pyright: reportCallIssue=false, reportPossiblyUnboundVariable=false, reportArgumentType=false

from __future__ import annotations

import torch
import triton
import triton.language as tl
from sparkinfer.kernels._triton import dot_dtype, num_multiprocessors
from sparkinfer.kernels.dependent_launch import dependent_launch, wait_for_prior_kernels
from sparkinfer.kernels.linear._arrival import MAX_ARRIVAL_COUNTERS, arrival_counters_for
from sparkinfer.kernels.linear._tiles import tile_dot, tile_offsets, zero_tile
from triton.tools.tensor_descriptor import TensorDescriptor


@triton.jit
def _stream_k_kernel(
    p_x, p_w, desc_x, desc_w, p_y, p_part, p_arrived,
    M, N, K, ITERS_PER_PROGRAM,
    stride_xm, stride_wn,
    BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr, TMA: tl.constexpr,
    DOT_DTYPE: tl.constexpr, USE_PDL: tl.constexpr,
):  # fmt: skip
    wait_for_prior_kernels(USE_PDL)
    pid = tl.program_id(0)
    num_k = tl.cdiv(K, BK)
    start = pid * ITERS_PER_PROGRAM
    end = tl.minimum(start + ITERS_PER_PROGRAM, tl.cdiv(N, BN) * num_k)
    o_m = tl.arange(0, BM).to(tl.int64)
    m_m = o_m < M
    # A partial is [BN, BM] fp32 at p_part[program, slot]: slot 0 for the program's first tile,
    # 1 for its last (a range spans at most one partial tile at each end).
    o_local = tl.arange(0, BM)[None, :] * BN + tl.arange(0, BN)[:, None]
    first_tile = start // num_k
    it = start
    while it < end:
        i_n = it // num_k
        j0 = it - i_n * num_k
        j1 = tl.minimum(num_k, j0 + end - it)
        b_acc = zero_tile(BM, BN, True)
        o_n = tl.cast(i_n, tl.int64) * BN + tl.arange(0, BN).to(tl.int64)
        m_n = o_n < N
        for j in range(j0, j1):
            if TMA:  # zeros past M, N and K
                b_x = desc_x.load([0, j * BK])
                b_w = desc_w.load([i_n * BN, j * BK])
            else:
                o_k = tl.cast(j, tl.int64) * BK + tl.arange(0, BK).to(tl.int64)
                m_k = o_k < K
                b_x = tl.load(p_x + o_m[:, None] * stride_xm + o_k[None, :],
                              mask=m_m[:, None] & m_k[None, :], other=0.0)  # fmt: skip
                b_w = tl.load(p_w + o_n[:, None] * stride_wn + o_k[None, :],
                              mask=m_n[:, None] & m_k[None, :], other=0.0)  # fmt: skip
            b_acc = tile_dot(b_x, b_w, b_acc, DOT_DTYPE, True)
        o_mn, m_mn = tile_offsets(o_m, o_n, m_m, m_n, N, True)
        if j0 == 0 and j1 == num_k:
            tl.store(p_y + o_mn, b_acc.to(p_y.dtype.element_ty), mask=m_mn)
        else:
            slot = tl.cast(i_n != first_tile, tl.int64)
            tl.store(p_part + (tl.cast(pid, tl.int64) * 2 + slot) * BM * BN + o_local, b_acc)
            tl.debug_barrier()  # every thread's partial precedes the release below
            q_first = i_n * num_k // ITERS_PER_PROGRAM
            q_last = ((i_n + 1) * num_k - 1) // ITERS_PER_PROGRAM
            if tl.atomic_add(p_arrived + i_n, 1, sem="acq_rel") == q_last - q_first:
                # The last program to arrive sums the tile's partials in K order.
                b_sum = zero_tile(BM, BN, True)
                for q in range(q_first, q_last + 1):
                    q_slot = tl.cast(i_n != q * ITERS_PER_PROGRAM // num_k, tl.int64)
                    p_q = p_part + (tl.cast(q, tl.int64) * 2 + q_slot) * BM * BN + o_local
                    b_sum += tl.load(p_q, cache_modifier=".cg")
                tl.store(p_y + o_mn, b_sum.to(p_y.dtype.element_ty), mask=m_mn)
                tl.store(p_arrived + i_n, 0)  # every sharer has arrived: ready for the next launch
        it = (i_n + 1) * num_k


def stream_k_plan(m: int, n: int, k: int, bn: int, bk: int, programs: int) -> tuple[int, int]:
    """(programs, iterations per program) covering ceil(n / bn) * ceil(k / bk) iterations in
    equal contiguous ranges, at most `programs` of them."""
    total = triton.cdiv(n, bn) * triton.cdiv(k, bk)
    per_program = triton.cdiv(total, max(1, min(programs, total)))
    return triton.cdiv(total, per_program), per_program


def stream_k_gemm(
    x: torch.Tensor,
    weight: torch.Tensor,
    *,
    bn: int,
    bk: int,
    programs_per_sm: int,
    num_warps: int = 4,
    num_stages: int = 4,
    use_tma: bool = True,
) -> torch.Tensor:
    """y = x @ weight.T for at most 64 rows of x, fp32 accumulate, over `programs_per_sm` programs
    per SM (`skinny_gemm` with a `STREAM_K` config calls this; operands checked there).

    Returns:
        y: [M, N] contiguous in x.dtype.
    """
    (m, k), n = x.shape, weight.shape[0]
    bm = max(16, triton.next_power_of_2(m))
    if bm > 64:
        raise ValueError(f"stream_k_gemm: x has {m} rows; it takes at most 64: use skinny_gemm")
    y = torch.empty((m, n), dtype=x.dtype, device=x.device)
    if m == 0 or n == 0:
        return y
    if triton.cdiv(n, bn) > MAX_ARRIVAL_COUNTERS:
        raise ValueError(
            f"stream_k_gemm: {triton.cdiv(n, bn)} column tiles exceed {MAX_ARRIVAL_COUNTERS}; "
            "use a wider BN"
        )
    programs, per_program = stream_k_plan(
        m, n, k, bn, bk, programs_per_sm * num_multiprocessors(x.device)
    )
    part = torch.empty((programs, 2, bn * bm), dtype=torch.float32, device=x.device)
    desc_x, desc_w = x, weight  # not read without TMA
    if use_tma:
        desc_x = TensorDescriptor(x, [m, k], [x.stride(0), 1], [bm, bk])
        desc_w = TensorDescriptor(weight, [n, k], [weight.stride(0), 1], [bn, bk])
    pdl = dependent_launch(x)
    _stream_k_kernel[(programs,)](
        x, weight, desc_x, desc_w, y, part, arrival_counters_for(x.device),
        m, n, k, per_program,
        x.stride(0), weight.stride(0),
        BM=bm, BN=bn, BK=bk, TMA=use_tma, DOT_DTYPE=dot_dtype(x), USE_PDL=pdl,
        num_warps=num_warps, num_stages=num_stages, launch_pdl=pdl,
    )  # fmt: skip
    return y
