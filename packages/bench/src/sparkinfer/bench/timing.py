"""Timing: warm-up, then the median and p90 of fixed iterations (CUDA events, or host wall time)."""

from __future__ import annotations

import itertools
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
import torch


@dataclass(frozen=True)
class Timing:
    median_ms: float
    p90_ms: float
    num_iters: int


def time_cuda(fn: Callable[[], object], *, warmup: int = 5, iters: int = 20) -> Timing:
    """Run `fn` `warmup` times untimed, then time each of `iters` calls with CUDA events.

    On a CPU-only machine the calls are timed with perf_counter instead (for smoke tests only).
    """
    return time_cuda_interleaved([fn], warmup=warmup, iters=iters)[0]


def time_cuda_interleaved(
    fns: Sequence[Callable[[], object]], *, warmup: int = 5, iters: int = 20
) -> list[Timing]:
    """`time_cuda` of several functions whose calls alternate (a, b, a, b, ...), so that a drift
    of the GPU's clocks during the run falls on each of them alike; one Timing per function."""
    for _ in range(warmup):
        for fn in fns:
            fn()
    times_ms: list[list[float]] = [[] for _ in fns]
    for _ in range(iters):
        for i, fn in enumerate(fns):
            times_ms[i].append(_time_call_ms(fn))
    return [Timing(float(np.median(t)), float(np.percentile(t, 90)), iters) for t in times_ms]


def _time_call_ms(fn: Callable[[], object]) -> float:
    """One call's time: CUDA events on a CUDA machine, else the host's wall clock."""
    if not torch.cuda.is_available():
        t0 = time.perf_counter()
        fn()
        return (time.perf_counter() - t0) * 1e3
    start = torch.cuda.Event(enable_timing=True)
    end = torch.cuda.Event(enable_timing=True)
    start.record()
    fn()
    end.record()
    end.synchronize()
    return start.elapsed_time(end)


def time_cpu(fn: Callable[[], object], *, warmup: int = 5, iters: int = 20) -> Timing:
    """Run `fn` `warmup` times untimed, then time each of `iters` calls by host wall clock."""
    for _ in range(warmup):
        fn()
    times_ms = []
    for _ in range(iters):
        t0 = time.perf_counter()
        fn()
        times_ms.append((time.perf_counter() - t0) * 1e3)
    return Timing(float(np.median(times_ms)), float(np.percentile(times_ms, 90)), iters)


def time_on(
    device: torch.device, fn: Callable[[], object], *, warmup: int = 5, iters: int = 20
) -> Timing:
    """CUDA-event timing for work on a CUDA device, host wall clock for work on the CPU."""
    if device.type == "cuda":
        return time_cuda(fn, warmup=warmup, iters=iters)
    return time_cpu(fn, warmup=warmup, iters=iters)


def time_back_to_back(
    device: torch.device,
    fn: Callable[[], object],
    *,
    warmup: int = 3,
    iters: int = 10,
    calls: int = 10,
) -> Timing:
    """Per-call time of `calls` calls launched back to back, median and p90 over `iters` intervals:
    the device-ceiling measurements. On CUDA one untimed call runs ahead of each interval, so the
    GPU is busy while the host launches the timed ones and no host dispatch lands inside it (one
    call timed alone on an idle GPU also counts the host's launch). On the CPU: wall clock."""
    for _ in range(warmup):
        fn()
    interval_ms = _cuda_interval_ms if device.type == "cuda" else _wall_interval_ms
    times_ms = [interval_ms(fn, calls) / calls for _ in range(iters)]
    return Timing(float(np.median(times_ms)), float(np.percentile(times_ms, 90)), iters)


def _cuda_interval_ms(fn: Callable[[], object], calls: int) -> float:
    fn()  # the GPU runs this while the host launches the timed calls
    start = torch.cuda.Event(enable_timing=True)
    end = torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(calls):
        fn()
    end.record()
    end.synchronize()
    return start.elapsed_time(end)


def _wall_interval_ms(fn: Callable[[], object], calls: int) -> float:
    t0 = time.perf_counter()
    for _ in range(calls):
        fn()
    return (time.perf_counter() - t0) * 1e3


def time_at_power_cap(
    device: torch.device, fn: Callable[[], object], *, warm_s: float = 0.4, iters: int = 30
) -> Timing:
    """Per-call time of `iters` calls launched back to back after `warm_s` seconds of the same
    calls: the GPU's sustained speed. A burst of a few milliseconds runs at full clock; under
    seconds of dense matmuls the GPU sits at its power cap at a lower clock, as a prompt's forward
    does (figures: docs/benchmarks.md). On the CPU: wall clock, no warm-up."""
    if device.type != "cuda":
        return time_back_to_back(device, fn, warmup=0, iters=iters, calls=1)
    start = time.perf_counter()
    while time.perf_counter() - start < warm_s:
        for _ in range(4):
            fn()
        torch.cuda.synchronize()
    events = [torch.cuda.Event(enable_timing=True) for _ in range(iters + 1)]
    fn()  # the GPU runs this while the host launches the timed calls
    events[0].record()
    for end in events[1:]:
        fn()
        end.record()
    events[-1].synchronize()
    times_ms = [a.elapsed_time(b) for a, b in itertools.pairwise(events)]
    return Timing(float(np.median(times_ms)), float(np.percentile(times_ms, 90)), iters)
