"""Timing of launch-bound kernels: a rotation of calls captured in one CUDA graph.

Decode-shaped kernels run for microseconds, less than a Python launch, and their inputs fit in
L2. Capturing a rotation of calls over distinct buffers (together larger than L2) measures the
kernels as the engine runs them (from CUDA graphs) and streams their bytes from HBM; replays run
back to back, long enough that neither the host's launch nor the gap between two graphs counts.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import torch
from sparkinfer.bench.timing import Timing, time_back_to_back

L2_FLUSH_BYTES = 256 * 2**20  # several times the H200's 50 MiB L2


def rotation_copies(bytes_per_call: int, *, max_copies: int = 32) -> int:
    """How many distinct input sets keep one graph replay out of L2."""
    return max(1, min(max_copies, -(-L2_FLUSH_BYTES // max(bytes_per_call, 1))))


# A replay runs at least this long (its calls repeated up to MAX_REPEATS times), so the gap
# between two graphs on the GPU stays a small share; replays run back to back, so the host's
# launch of the graph lands outside the timed intervals.
MIN_REPLAY_MS = 0.5
MAX_REPEATS = 128


def time_graph(calls: Sequence[Callable[[], object]], *, warmup: int, iters: int) -> Timing:
    """Median and p90 time of one call, from `iters` back-to-back replays of a graph running every
    call once, or several times over where one pass is shorter than MIN_REPLAY_MS."""
    # Warm up on the stream that captures: kernels that keep per-stream state (split-K's arrival
    # counters) make it there before capture, as the engine's warm-up forward does.
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for _ in range(max(warmup, 1)):
            for call in calls:
                call()
    torch.cuda.synchronize()
    graph = _capture(calls, 1, stream)
    repeats = min(MAX_REPEATS, max(1, math.ceil(MIN_REPLAY_MS / _replay_ms(graph, 2)[-1])))
    if repeats > 1:
        graph = _capture(calls, repeats, stream)
    # The first interval holds the host's launch of the first replay; the GPU never idles after.
    times_ms = _replay_ms(graph, iters + 1)[1:]
    per_call = [t / (repeats * len(calls)) for t in times_ms]
    return Timing(float(np.median(per_call)), float(np.percentile(per_call, 90)), iters)


def _capture(calls: Sequence[Callable[[], object]], repeats: int, stream) -> torch.cuda.CUDAGraph:
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, stream=stream):
        for _ in range(repeats):
            for call in calls:
                call()
    graph.replay()
    torch.cuda.synchronize()
    return graph


def _replay_ms(graph: torch.cuda.CUDAGraph, count: int) -> list[float]:
    """The times of `count` replays launched back to back, each between two events."""
    events = [torch.cuda.Event(enable_timing=True) for _ in range(count + 1)]
    events[0].record()
    for event in events[1:]:
        graph.replay()
        event.record()
    events[-1].synchronize()
    return [a.elapsed_time(b) for a, b in itertools.pairwise(events)]


COPY_PEER = "copy, same bytes"  # the impl name of a `same_bytes_copies` peer row


def same_bytes_copies(nbytes: int, count: int, device: torch.device) -> list[Callable[[], object]]:
    """`count` copies between distinct fp32 buffers, each reading nbytes // 2 and writing as
    many: the traffic of a kernel that moves `nbytes`, as a peer row timed like it
    (`time_graph`). Each copy is an elementwise kernel (a multiply by one), since a plain copy
    captured in a graph becomes a memcpy node, which runs slower. At the few MiB of a
    one-sequence decode such a copy stays far below the copy rate of large buffers, which
    bounds what any kernel of that size reaches."""
    numel = max(nbytes // 8, 1)
    srcs = [torch.ones(numel, dtype=torch.float32, device=device) for _ in range(count)]
    dsts = [torch.empty_like(src) for src in srcs]
    return [
        lambda src=src, dst=dst: torch.mul(src, 1.0, out=dst)
        for src, dst in zip(srcs, dsts, strict=True)
    ]


def copy_bandwidth(device: torch.device, *, mib: int = 1024) -> float:
    """Device-to-device copy bytes/s (read + write): the roofline of memory-bound ops."""
    src = torch.empty(mib * 2**20, dtype=torch.uint8, device=device)
    dst = torch.empty_like(src)
    # Timed eagerly, back to back: a copy captured in a graph becomes a memcpy node, which is
    # slower, and one copy timed alone on an idle GPU also counts the host's launch.
    t = time_back_to_back(device, lambda: dst.copy_(src))
    return 2 * src.numel() / (t.median_ms / 1e3)


def bandwidth_row(
    op: str,
    impl: str,
    shape: str,
    t: Timing,
    *,
    nbytes: int,
    copy: float,
    extra: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """One table row of a memory-bound bf16 kernel: its times, GB/s over `nbytes` and the
    fraction of the copy rate `copy` (bytes/s); `extra` columns follow."""
    return {
        "op": op, "impl": impl, "shape": shape, "dtype": "bf16",
        "median_ms": t.median_ms, "p90_ms": t.p90_ms, "GB/s": nbytes / t.median_ms / 1e6,
        "of_copy_bw": nbytes / (t.median_ms / 1e3) / copy,
        **(extra or {}),
    }  # fmt: skip
