"""Capture one CUDA graph per bucket size: the loop every graph family shares (decode, verify,
MTP head, prefill)."""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
from sparkinfer.scheduler.errors import GraphCaptureError

logger = logging.getLogger(__name__)


@dataclass
class Captured:
    graph: torch.cuda.CUDAGraph
    output: torch.Tensor  # written by each replay


def capture_buckets(
    sizes: Sequence[int],
    stream: torch.cuda.Stream,
    forward: Callable[[int], torch.Tensor],
    *,
    what: str,
    prepare: Callable[[int], object] = lambda size: None,
) -> dict[int, Captured]:
    """Capture `forward(size)` for every size, largest first so the smaller ones reuse its memory
    pool; `prepare(size)` fills the static buffers first. `what` names a bucket in messages
    ("decode graph for batch size", "prefill graph for tokens")."""
    pool = torch.cuda.graph_pool_handle()
    # The buffers were filled on the caller's stream, which our non-blocking stream does not
    # follow. Unordered, while that stream is still busy (zeroing big caches, at a long
    # max_model_len) the warm-up reads input ids not yet zeroed: an out-of-bounds gather.
    stream.wait_stream(torch.cuda.current_stream(stream.device))
    captured: dict[int, Captured] = {}
    for size in sorted(sizes, reverse=True):
        prepare(size)
        with torch.cuda.stream(stream):
            forward(size)  # warm-up: Triton compiles and autotunes outside capture
        stream.synchronize()
        graph = torch.cuda.CUDAGraph()
        try:
            with torch.cuda.graph(graph, pool=pool, stream=stream):
                output = forward(size)
        except RuntimeError as exc:
            raise GraphCaptureError(
                f"capturing the {what} {size} failed ({exc}); the model's forward must not sync "
                "with the host: set enforce_eager=True"
            ) from exc
        captured[size] = Captured(graph, output)
        logger.info("captured %s %d", what, size)
    return captured
