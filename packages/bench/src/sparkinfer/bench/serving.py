"""HTTP load: the concurrency sweep (`serve`) and the 6/8/10/12-stream diagnostic."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from sparkinfer.bench import corpus
from sparkinfer.bench.calibration import tokens_per_word
from sparkinfer.bench.client import GenRequest, OpenAIClient, RequestResult
from sparkinfer.bench.report import Gate, Plot, Table, log
from sparkinfer.bench.stats import LevelStats, find_stalls, inter_token_latencies, level_stats

_PERCENTILE_COLUMNS = ("mean", "p50", "p90", "p99")


async def run_level(
    client: OpenAIClient, reqs: Sequence[GenRequest], concurrency: int
) -> tuple[list[RequestResult], float]:
    """Send `reqs` with at most `concurrency` in flight; returns results and the wall clock."""
    gate = asyncio.Semaphore(concurrency)

    async def one(req: GenRequest) -> RequestResult:
        async with gate:
            return await client.generate(req)

    start = time.perf_counter()
    results = await asyncio.gather(*(one(r) for r in reqs))
    return list(results), time.perf_counter() - start


@dataclass(frozen=True)
class ServeConfig:
    levels: tuple[int, ...]
    input_len: int
    output_len: int
    num_prompts: int | None  # per level; None: 4 x concurrency, at least 8
    dataset: list[corpus.DatasetPrompt] | None
    seed: int
    num_warmup: int


def _requests(cfg: ServeConfig, first_idx: int, count: int, tpw: float) -> list[GenRequest]:
    reqs = []
    for idx in range(first_idx, first_idx + count):
        if cfg.dataset is None:
            prompt = corpus.random_prompt(cfg.input_len, idx, cfg.seed, tpw)
            reqs.append(GenRequest(prompt=prompt, max_tokens=cfg.output_len))
            continue
        item = cfg.dataset[idx % len(cfg.dataset)]
        opener = corpus.unique_prefix(idx, cfg.seed)
        if item.messages is not None:
            msgs = [dict(m) for m in item.messages]
            msgs[0]["content"] = f"{opener}\n{msgs[0].get('content', '')}"
            reqs.append(GenRequest(messages=msgs, max_tokens=cfg.output_len))
        else:
            reqs.append(GenRequest(prompt=f"{opener}\n{item.prompt}", max_tokens=cfg.output_len))
    return reqs


async def sweep(client: OpenAIClient, cfg: ServeConfig) -> list[tuple[LevelStats, list[str]]]:
    """Run every concurrency level in turn; each level gets prompts no other request has used."""
    tpw = 1.0 if cfg.dataset is not None else await tokens_per_word(client, cfg.seed)
    idx = 0
    if cfg.num_warmup:
        await run_level(client, _requests(cfg, 10**7, cfg.num_warmup, tpw), cfg.num_warmup)
    out = []
    for level in cfg.levels:
        count = cfg.num_prompts or max(8, 4 * level)
        log(f"serve: concurrency {level}, {count} requests")
        results, duration = await run_level(client, _requests(cfg, idx, count, tpw), level)
        idx += count
        stats = level_stats(results, duration_s=duration, concurrency=level)
        errors = sorted({r.error for r in results if r.error})
        log(
            f"serve: concurrency {level}: {stats.output_tok_s:.1f} output tok/s, "
            f"{stats.num_failed} failed"
        )
        out.append((stats, errors))
    return out


def serve_tables(levels: list[tuple[LevelStats, list[str]]]) -> list[Table]:
    throughput = Table(
        "throughput per concurrency level",
        [
            "concurrency",
            "ok",
            "failed",
            "duration s",
            "input tok",
            "output tok",
            "output tok/s",
            "total tok/s",
            "req/s",
        ],
        [
            [
                s.concurrency,
                s.num_ok,
                s.num_failed,
                s.duration_s,
                s.input_tokens,
                s.output_tokens,
                s.output_tok_s,
                s.total_tok_s,
                s.request_s,
            ]
            for s, _ in levels
        ],
    )
    cols = ["concurrency"]
    for metric in ("TTFT", "TPOT", "ITL", "E2E"):
        cols += [f"{metric} {p}" for p in _PERCENTILE_COLUMNS]
    rows = []
    for s, _ in levels:
        row: list[object] = [s.concurrency]
        for summary in (s.ttft_ms, s.tpot_ms, s.itl_ms, s.e2e_ms):
            row += [summary.mean, summary.median, summary.p90, summary.p99]
        rows.append(row)
    latency = Table("latency per concurrency level (ms)", cols, rows)
    for s, errors in levels:
        throughput.notes += [f"concurrency {s.concurrency}: {e}" for e in errors[:3]]
    return [throughput, latency]


def serve_plots(levels: list[tuple[LevelStats, list[str]]]) -> list[Plot]:
    x = [s.concurrency for s, _ in levels]
    stats = [s for s, _ in levels]
    return [
        Plot(
            "serve-throughput.png",
            "Aggregate output throughput",
            "concurrent requests",
            "output tok/s",
            x,
            {"output tok/s": [s.output_tok_s for s in stats]},
            is_log_x=True,
        ),
        Plot(
            "serve-latency.png",
            "Latency vs concurrency",
            "concurrent requests",
            "ms",
            x,
            {
                "TTFT p50": [s.ttft_ms.median for s in stats],
                "TTFT p99": [s.ttft_ms.p99 for s in stats],
                "TPOT p50": [s.tpot_ms.median for s in stats],
                "ITL p99": [s.itl_ms.p99 for s in stats],
                "E2E p50": [s.e2e_ms.median for s in stats],
            },
            is_log_x=True,
            is_log_y=True,
        ),
    ]


def serve_gate(levels: list[tuple[LevelStats, list[str]]]) -> Gate:
    failed = sum(s.num_failed for s, _ in levels)
    return Gate("all requests succeed", failed == 0, f"{failed} failed request(s)")


@dataclass(frozen=True)
class StreamReport:
    num_streams: int
    stream_idx: int
    tokens: int
    tok_s: float | None  # decode rate after the first token
    ttft_ms: float | None
    max_gap_ms: float | None
    num_stalls: int
    error: str | None


async def diagnose(
    client: OpenAIClient,
    stream_counts: Sequence[int],
    *,
    input_len: int,
    output_len: int,
    stall_factor: float,
    seed: int,
) -> list[StreamReport]:
    """All streams of a level start together; stalls are gaps over `stall_factor` x median ITL."""
    tpw = await tokens_per_word(client, seed)
    reports, idx = [], 0
    for n in stream_counts:
        log(f"diagnose-concurrency: {n} streams")
        reqs = [
            GenRequest(
                prompt=corpus.random_prompt(input_len, idx + i, seed, tpw), max_tokens=output_len
            )
            for i in range(n)
        ]
        idx += n
        results, _ = await run_level(client, reqs, n)
        gaps = [g for r in results if r.is_ok for g in inter_token_latencies(r.chunk_times_s)]
        median = float(np.median(gaps)) if gaps else 0.0
        for i, r in enumerate(results):
            own = inter_token_latencies(r.chunk_times_s)
            decode_s = (r.chunk_times_s[-1] - r.chunk_times_s[0]) if len(r.chunk_times_s) > 1 else 0
            reports.append(
                StreamReport(
                    n,
                    i,
                    r.output_tokens,
                    (len(r.chunk_times_s) - 1) / decode_s if decode_s > 0 else None,
                    None if r.ttft_s is None else r.ttft_s * 1e3,
                    max(own) * 1e3 if own else None,
                    len(find_stalls(own, factor=stall_factor, median_s=median)) if median else 0,
                    r.error,
                )
            )
    return reports


def diagnose_tables(reports: list[StreamReport], stall_factor: float) -> list[Table]:
    levels = sorted({r.num_streams for r in reports})
    summary_rows = []
    for n in levels:
        level = [r for r in reports if r.num_streams == n]
        rates = [r.tok_s for r in level if r.tok_s is not None]
        summary_rows.append(
            [
                n,
                sum(r.error is None for r in level),
                sum(r.error is not None for r in level),
                sum(rates),
                min(rates, default=None),
                float(np.median(rates)) if rates else None,
                sum(r.num_stalls for r in level),
            ]
        )
    summary = Table(
        f"streams (stall: gap > {stall_factor:g} x median ITL)",
        ["streams", "ok", "errors", "sum tok/s", "min tok/s", "median tok/s", "stalls"],
        summary_rows,
    )
    per_stream = Table(
        "per stream",
        ["streams", "stream", "tokens", "tok/s", "TTFT ms", "max gap ms", "stalls", "error"],
        [
            [
                r.num_streams,
                r.stream_idx,
                r.tokens,
                r.tok_s,
                r.ttft_ms,
                r.max_gap_ms,
                r.num_stalls,
                (r.error or "")[:60],
            ]
            for r in reports
        ],
    )
    return [summary, per_stream]
