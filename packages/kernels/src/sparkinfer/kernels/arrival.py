"""Arrival counters: the last program of a group to finish its share (elected by an atomic count)
does the group's final step, in a fixed order, inside the same launch.

The skinny GEMM's split-K sum and the decode attention's merge of its KV splits use them: no
second kernel runs, and results never depend on which program finishes last.
"""

from __future__ import annotations

import torch

MAX_GROUPS = 1 << 16  # counters per set: groups one launch may count
_counters: dict[tuple[torch.device, int], torch.Tensor] = {}


def arrival_counters(device: torch.device, op: str) -> torch.Tensor:
    """Zeroed int32 counters, one set per (device, stream); each launch leaves them at 0.

    Launches on one stream run in order, so they share a set; a CUDA graph captured on a stream
    uses the set made there before capture (by the capture's eager warm-up). `op` names the
    caller in the error raised when the first use on a stream is inside capture.
    """
    stream = torch.cuda.current_stream(device).cuda_stream if device.type == "cuda" else 0
    counters = _counters.get((device, stream))
    if counters is None:
        if device.type == "cuda" and torch.cuda.is_current_stream_capturing():
            raise RuntimeError(
                f"{op}: the first launch with arrival counters on this stream is inside "
                "CUDA-graph capture; run the forward once on the capture stream before capturing"
            )
        counters = torch.zeros(MAX_GROUPS, dtype=torch.int32, device=device)
        _counters[(device, stream)] = counters
    return counters
