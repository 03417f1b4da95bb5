"""Arrival counters: the last program of a group to finish does the group's final step.

A kernel whose programs each hold part of a result (split-K slices, one head's V blocks) counts
their arrivals with an `atomic_add(..., sem="acq_rel")`; the program that sees the group's last
arrival reads every part back (their writes precede its acquire) and finishes in a fixed order,
so the result never depends on which program came last, and no second kernel runs. That program
also sets the counter back to 0, so each launch leaves the set as it found it.
"""

from __future__ import annotations

import torch

MAX_COUNTERS = 1 << 16
_arrival_counters: dict[tuple[torch.device, int], torch.Tensor] = {}


def arrival_counters(device: torch.device, op: str) -> torch.Tensor:
    """Zeroed int32 counters [MAX_COUNTERS], one set per (device, stream).

    Launches on one stream run in order, so they share a set; a CUDA graph captured on a stream
    uses the set made there before capture (by the capture's eager warm-up). `op` names the
    caller in the error raised when the first launch on a stream is inside capture.
    """
    stream = torch.cuda.current_stream(device).cuda_stream if device.type == "cuda" else 0
    counters = _arrival_counters.get((device, stream))
    if counters is None:
        if device.type == "cuda" and torch.cuda.is_current_stream_capturing():
            raise RuntimeError(
                f"{op}: the first launch with arrival counters on this stream is inside "
                "CUDA-graph capture; run the forward once on the capture stream before capturing"
            )
        counters = torch.zeros(MAX_COUNTERS, dtype=torch.int32, device=device)
        _arrival_counters[(device, stream)] = counters
    return counters
