"""What the split-K GEMMs share (the bf16 skinny GEMM, the FP8 GEMV and decode GEMM): the plan
that cuts K into whole tiles, and the arrival counters that elect each output tile's last slice
to sum every slice's partial in slice order (deterministic, no second kernel)."""

from __future__ import annotations

import torch
import triton

MAX_TILES = 1 << 16  # output tiles one split launch may count arrivals for
_arrival_counters: dict[tuple[torch.device, int], torch.Tensor] = {}


def split_k_plan(k: int, split_k: int, step: int) -> tuple[int, int]:
    """(slices, K per slice) for at most `split_k` slices of whole `step`-wide K tiles."""
    split_k = max(1, min(split_k, triton.cdiv(k, step)))
    k_per_split = triton.cdiv(triton.cdiv(k, split_k), step) * step
    return (triton.cdiv(k, k_per_split) if k else 1), k_per_split


def arrival_counters_for(device: torch.device) -> torch.Tensor:
    """Zeroed int32 arrival counters, one set per (device, stream); each launch leaves them at 0.

    Launches on one stream run in order, so every split-K kernel on it shares a set; a CUDA
    graph captured on a stream uses the set made there before capture (by the capture's eager
    warm-up).
    """
    stream = torch.cuda.current_stream(device).cuda_stream if device.type == "cuda" else 0
    counters = _arrival_counters.get((device, stream))
    if counters is None:
        if device.type == "cuda" and torch.cuda.is_current_stream_capturing():
            raise RuntimeError(
                "split-K GEMM: the first split-K launch on this stream is inside CUDA-graph "
                "capture; run the forward once on the capture stream before capturing"
            )
        counters = torch.zeros(MAX_TILES, dtype=torch.int32, device=device)
        _arrival_counters[(device, stream)] = counters
    return counters
