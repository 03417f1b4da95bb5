"""Deterministic split-K for the FP8 decode kernels: K cut into slices run by separate programs.

A projection with few output columns (the down and out projections) gives too few programs to
keep every SM streaming; splitting K multiplies them. Each slice stores its fp32 partial tile in
`part` [SPLIT_K, M, N]; the last slice of each output tile to finish (elected by an arrival
counter) sums every slice's partial in slice order and writes y, so the result never depends on
which slice finishes first, and no second kernel runs. The plan and the counters are
`kernels.split_k`'s, shared with the bf16 skinny GEMM (launches on one stream run in order, so
the kernel families share one set of counters safely).
"""

# Triton's annotations misread valid kernel code: tl.static_range.
# pyright: reportGeneralTypeIssues=false

from __future__ import annotations

import torch
import triton
import triton.language as tl
from sparkinfer.kernels.split_k import MAX_TILES, arrival_counters_for


def split_k_buffers(
    op: str, y: torch.Tensor, num_slices: int, num_tiles: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """(partials [num_slices, M, N] fp32, arrival counters) of a split launch; (y, y) unsplit."""
    if num_slices == 1:
        return y, y  # not read with one slice
    if num_tiles > MAX_TILES:
        raise ValueError(
            f"{op}: {num_tiles} output tiles exceed {MAX_TILES}; use a wider BN or SPLIT_K=1"
        )
    part = torch.empty((num_slices, *y.shape), dtype=torch.float32, device=y.device)
    return part, arrival_counters_for(y.device)


@triton.jit
def store_or_reduce(p_y, p_part, p_arrived, b_acc, o_mn, m_mn, i_tile, i_k, MN,
                    SPLIT_K: tl.constexpr):  # fmt: skip
    """Store the fp32 tile b_acc at offsets o_mn of y; with SPLIT_K > 1 store it as slice i_k's
    partial, and let the tile's last slice to arrive sum all partials in slice order into y."""
    if SPLIT_K == 1:
        tl.store(p_y + o_mn, b_acc.to(p_y.dtype.element_ty), mask=m_mn)
    else:
        tl.store(p_part + i_k.to(tl.int64) * MN + o_mn, b_acc, mask=m_mn)
        tl.debug_barrier()  # every thread's partial precedes the release below
        p_tile = p_arrived + i_tile
        if tl.atomic_add(p_tile, 1, sem="acq_rel") == SPLIT_K - 1:
            b_sum = tl.zeros_like(b_acc)
            for s in tl.static_range(SPLIT_K):
                b_sum += tl.load(p_part + s * MN + o_mn, mask=m_mn, other=0.0, cache_modifier=".cg")
            tl.store(p_y + o_mn, b_sum.to(p_y.dtype.element_ty), mask=m_mn)
            tl.store(p_tile, 0)  # every slice has arrived: ready for the next launch
