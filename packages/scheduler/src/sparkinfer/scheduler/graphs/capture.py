"""Capture one CUDA graph per bucket size: the loop every graph family shares (decode, verify,
MTP head, prefill)."""

from __future__ import annotations

import contextlib
import gc
import logging
from collections.abc import Callable, Generator, Sequence
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
    pool: object | None = None,
) -> dict[int, Captured]:
    """Capture `forward(size)` for every size, largest first so the smaller ones reuse its memory
    pool; `prepare(size)` fills the static buffers first. `what` names a bucket in messages
    ("decode graph for batch size", "prefill graph for tokens"). pool: a
    `torch.cuda.graph_pool_handle()` shared with graphs captured before (a family that captures
    its buckets as they are first needed); None: a new one."""
    pool = torch.cuda.graph_pool_handle() if pool is None else pool
    # The buffers were filled on the caller's stream, which our non-blocking stream does not
    # follow. Unordered, while that stream is still busy (zeroing big caches, at a long
    # max_model_len) the warm-up reads input ids not yet zeroed: an out-of-bounds gather.
    stream.wait_stream(torch.cuda.current_stream(stream.device))
    captured: dict[int, Captured] = {}
    with no_collection():
        for size in sorted(sizes, reverse=True):
            captured[size] = _capture_one(size, stream, pool, forward, what, prepare)
    return captured


@contextlib.contextmanager
def no_collection() -> Generator[None]:
    """Python's cycle collector off while graphs are captured: a collection inside a capture can
    free another object's CUDA graph (a runner or engine left to the collector), and destroying a
    graph while a stream captures invalidates the capture ("operation not permitted when stream
    is capturing"). What is garbage already is collected first."""
    was_enabled = gc.isenabled()
    gc.collect()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()


def _capture_one(
    size: int,
    stream: torch.cuda.Stream,
    pool: object,  # torch.cuda.graph_pool_handle()
    forward: Callable[[int], torch.Tensor],
    what: str,
    prepare: Callable[[int], object],
) -> Captured:
    prepare(size)
    with torch.cuda.stream(stream):
        forward(size)  # warm-up: Triton compiles and autotunes outside capture
    stream.synchronize()
    graph = torch.cuda.CUDAGraph()
    try:
        with torch.cuda.graph(graph, pool=pool, stream=stream):  # pyright: ignore[reportArgumentType]
            output = forward(size)
    except RuntimeError as exc:
        raise GraphCaptureError(
            f"capturing the {what} {size} failed ({exc}); the model's forward must not sync "
            "with the host: set enforce_eager=True"
        ) from exc
    logger.info("captured %s %d", what, size)
    return Captured(graph, output)
