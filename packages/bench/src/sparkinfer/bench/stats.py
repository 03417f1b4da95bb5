"""Latency and throughput statistics, defined as in vLLM's and SGLang's serving benchmarks.

- TTFT: request sent → first streamed token.
- TPOT: per request, (E2E − TTFT) / (output tokens − 1); summarised over requests.
- ITL: every gap between consecutive streamed chunks, pooled over requests.
- E2E: request sent → last byte.
Percentiles use numpy's default linear interpolation, like both peers.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass

import numpy as np
from sparkinfer.bench.client import RequestResult


@dataclass(frozen=True)
class Summary:
    """Mean, median, p90, p99 and max of a sample (NaN when empty)."""

    count: int
    mean: float
    median: float
    p90: float
    p99: float
    max: float

    def scaled(self, factor: float) -> Summary:
        return Summary(
            self.count,
            *(v * factor for v in (self.mean, self.median, self.p90, self.p99, self.max)),
        )

    def as_dict(self) -> dict[str, float]:
        return asdict(self)


def summarize(values: Sequence[float]) -> Summary:
    """Summary statistics of `values` (any unit; the result keeps it)."""
    if len(values) == 0:
        nan = math.nan
        return Summary(0, nan, nan, nan, nan, nan)
    arr = np.asarray(values, dtype=np.float64)
    p50, p90, p99 = np.percentile(arr, [50, 90, 99])
    return Summary(
        len(arr), float(arr.mean()), float(p50), float(p90), float(p99), float(arr.max())
    )


def inter_token_latencies(chunk_times_s: Sequence[float]) -> list[float]:
    """Gaps between consecutive chunk arrival times."""
    return [b - a for a, b in itertools.pairwise(chunk_times_s)]


def time_per_output_token(ttft_s: float, e2e_s: float, num_output_tokens: int) -> float | None:
    """Decode time per token after the first; None for single-token outputs."""
    if num_output_tokens < 2:
        return None
    return (e2e_s - ttft_s) / (num_output_tokens - 1)


def find_stalls(gaps_s: Sequence[float], *, factor: float, median_s: float) -> list[float]:
    """The gaps longer than `factor` times `median_s`."""
    limit = factor * median_s
    return [g for g in gaps_s if g > limit]


@dataclass(frozen=True)
class LevelStats:
    """One concurrency level of a serving run. Latencies are in milliseconds."""

    concurrency: int
    num_ok: int
    num_failed: int
    duration_s: float
    input_tokens: int
    output_tokens: int
    output_tok_s: float
    total_tok_s: float
    request_s: float
    ttft_ms: Summary
    tpot_ms: Summary
    itl_ms: Summary
    e2e_ms: Summary

    def as_dict(self) -> dict[str, object]:
        return asdict(self)


def level_stats(
    results: Sequence[RequestResult], *, duration_s: float, concurrency: int
) -> LevelStats:
    """Aggregate the requests of one level, run over `duration_s` of wall clock."""
    ok = [r for r in results if r.is_ok]
    ttft = [r.ttft_s for r in ok if r.ttft_s is not None]
    tpot = [
        t
        for r in ok
        if r.ttft_s is not None
        and (t := time_per_output_token(r.ttft_s, r.e2e_s, r.output_tokens)) is not None
    ]
    itl = [g for r in ok for g in inter_token_latencies(r.chunk_times_s)]
    input_tokens = sum(r.prompt_tokens or 0 for r in ok)
    output_tokens = sum(r.output_tokens for r in ok)
    duration_s = max(duration_s, 1e-9)
    return LevelStats(
        concurrency=concurrency,
        num_ok=len(ok),
        num_failed=len(results) - len(ok),
        duration_s=duration_s,
        input_tokens=input_tokens,
        output_tokens=output_tokens,
        output_tok_s=output_tokens / duration_s,
        total_tok_s=(input_tokens + output_tokens) / duration_s,
        request_s=len(ok) / duration_s,
        ttft_ms=summarize(ttft).scaled(1e3),
        tpot_ms=summarize(tpot).scaled(1e3),
        itl_ms=summarize(itl).scaled(1e3),
        e2e_ms=summarize([r.e2e_s for r in ok]).scaled(1e3),
    )
