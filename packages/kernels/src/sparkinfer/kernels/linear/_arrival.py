"""Arrival counters of the linear kernels whose last program to finish a tile sums its partials
(the skinny GEMM's K slices, the stream-K GEMM's shared tiles)."""

from __future__ import annotations

import torch

MAX_ARRIVAL_COUNTERS = 1 << 16
_arrival_counters: dict[tuple[torch.device, int], torch.Tensor] = {}


def arrival_counters_for(device: torch.device) -> torch.Tensor:
    """Zeroed int32 arrival counters, one set per (device, stream); each launch leaves them at 0.

    Launches on one stream run in order, so they share a set; a CUDA graph captured on a stream
    uses the set made there before capture (by the capture's eager warm-up).
    """
    stream = torch.cuda.current_stream(device).cuda_stream if device.type == "cuda" else 0
    counters = _arrival_counters.get((device, stream))
    if counters is None:
        if device.type == "cuda" and torch.cuda.is_current_stream_capturing():
            raise RuntimeError(
                "the first launch with arrival counters on this stream is inside CUDA-graph "
                "capture; run the forward once on the capture stream before capturing"
            )
        counters = torch.zeros(MAX_ARRIVAL_COUNTERS, dtype=torch.int32, device=device)
        _arrival_counters[(device, stream)] = counters
    return counters
