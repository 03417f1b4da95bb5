"""Where the GPU idled inside a run of kernels: the span from the first kernel's start to the last
one's end, the time no kernel ran in it, and its longest gaps with the kernels on either side
(from torch.profiler's kernel events; `profile` reports them per prefill)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Gap:
    """The GPU idle for `us` between the end of kernel `after` and the start of `before`."""

    us: float
    after: str
    before: str


@dataclass(frozen=True)
class Idle:
    """From the first kernel's start to the last one's end: the span, the time no kernel ran in
    it, and its longest gaps."""

    span_ms: float
    idle_ms: float
    gaps: tuple[Gap, ...]


def idle(events: list[tuple[str, float, float]], *, top: int) -> Idle:
    """Where no kernel ran between the first kernel's start and the last one's end, and the
    `top` longest such gaps with the kernels on either side (overlapping kernels count once)."""
    ordered = sorted(events, key=lambda e: e[1])
    if not ordered:
        return Idle(0.0, 0.0, ())
    gaps: list[Gap] = []
    end, last = ordered[0][1] + ordered[0][2], ordered[0][0]
    for name, start, us in ordered[1:]:
        if start > end:
            gaps.append(Gap(start - end, last, name))
        if start + us >= end:
            end, last = start + us, name
    span_us = end - ordered[0][1]
    longest = tuple(sorted(gaps, key=lambda g: -g.us)[:top])
    return Idle(span_us / 1e3, sum(g.us for g in gaps) / 1e3, longest)
