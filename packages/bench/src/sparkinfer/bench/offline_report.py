"""The offline benchmark's rows, release goals, tables, plots and gates."""

from __future__ import annotations

import math
from dataclasses import dataclass

from sparkinfer.bench import roofline
from sparkinfer.bench.report import Gate, Plot, Table

# Release goals on one H200 (docs/benchmarks.md lists them beside the measured figures).
GOAL_DECODE_1 = 76.0  # single stream at 4K context, tok/s
GOAL_DECODE_AT = (32, 1600.0)  # aggregate tok/s at this concurrency
GOAL_PREFILL = {4096: 13_000.0, 262_144: 5_300.0}  # prompt tok/s


@dataclass(frozen=True)
class DecodeRow:
    batch: int
    context: int
    stream_tok_s: float  # median over streams, after each one's first token
    aggregate_tok_s: float  # all streams decoding: tokens / time after the last first token
    e2e_tok_s: float  # all output tokens / wall clock from submission
    roofline_tok_s: float
    peak_gib: float
    errors: int
    has_goal: bool  # full 27B shapes: the release goals apply
    # every stream decoding at once: tokens / time from the last first token to the first finish
    steady_tok_s: float = math.nan


@dataclass(frozen=True)
class PrefillRow:
    prompt_len: int
    ttft_ms: float
    ttft_p90_ms: float
    tok_s: float
    roofline_tok_s: float
    peak_gib: float
    has_goal: bool


def _goal_decode(row: DecodeRow) -> float | None:
    if not row.has_goal:
        return None
    if row.batch == 1 and row.context == 4096:
        return GOAL_DECODE_1
    return GOAL_DECODE_AT[1] if row.batch == GOAL_DECODE_AT[0] else None


def _goal_prefill(row: PrefillRow) -> float | None:
    return GOAL_PREFILL.get(row.prompt_len) if row.has_goal else None


def _met(value: float, goal: float | None) -> str | None:
    return None if goal is None else ("met" if value >= goal else "MISSED")


def tables(
    peaks: roofline.Peaks, decode: list[DecodeRow], prefill: list[PrefillRow], peer: list
) -> list[Table]:
    """Peaks, decode and prefill tables, then the transformers peer when it ran."""
    capped = peaks.capped_matmul_flop_s
    peaks_table = Table(
        "measured peaks",
        ["copy GB/s (read+write)", "bf16 matmul TFLOP/s", "at the power cap TFLOP/s"],
        [[peaks.copy_bytes_s / 1e9, peaks.matmul_flop_s / 1e12, capped and capped / 1e12]],
        notes=[
            "at the power cap: the matmul after 0.4 s of it; the prefill roofline uses this rate "
            "(a prompt's forward runs at the cap), decode the copy rate"
        ],
    )
    out = [peaks_table, _decode_table(decode), _prefill_table(prefill)]
    if peer:
        out.append(_peer_table(peer, decode, prefill))
    return out


def _decode_table(decode: list[DecodeRow]) -> Table:
    rows = []
    for r in decode:
        goal = _goal_decode(r)
        value = r.stream_tok_s if r.batch == 1 else r.aggregate_tok_s
        rows.append([
            r.batch, r.context, r.stream_tok_s, r.aggregate_tok_s, r.steady_tok_s, r.e2e_tok_s,
            r.roofline_tok_s, value / r.roofline_tok_s, goal, _met(value, goal), r.peak_gib,
            r.errors,
        ])  # fmt: skip
    columns = [
        "batch", "context", "per-stream tok/s", "aggregate tok/s", "all-decoding tok/s",
        "e2e tok/s", "roofline tok/s", "of roofline", "goal", "", "peak GiB", "errors",
    ]  # fmt: skip
    notes = [
        "aggregate: tokens decoded once every stream is past prefill, over that time (the goal's "
        "figure; early streams finish first, so its tail runs fewer streams)",
        "all-decoding: tokens decoded while every stream decodes (from the last stream's first "
        "token to the first stream's last), over that time",
    ]
    return Table("decode (greedy, fixed output length)", columns, rows, notes)


def _prefill_table(prefill: list[PrefillRow]) -> Table:
    columns = [
        "prompt tokens", "TTFT p50 ms", "TTFT p90 ms", "tok/s", "roofline tok/s", "of roofline",
        "goal", "", "peak GiB",
    ]  # fmt: skip
    rows = [
        [
            r.prompt_len, r.ttft_ms, r.ttft_p90_ms, r.tok_s, r.roofline_tok_s,
            r.tok_s / r.roofline_tok_s, _goal_prefill(r), _met(r.tok_s, _goal_prefill(r)),
            r.peak_gib,
        ]
        for r in prefill
    ]  # fmt: skip
    return Table("prefill (one request, max_tokens 1)", columns, rows)


def _peer_table(peer: list, decode: list[DecodeRow], prefill: list[PrefillRow]) -> Table:
    """transformers beside sparkinfer, phase by phase (decode: single stream)."""
    ours = {f"prefill {r.prompt_len}": r.tok_s for r in prefill}
    ours |= {f"decode @{r.context}": r.stream_tok_s for r in decode if r.batch == 1}
    rows = [
        [
            p.phase,
            p.tok_s,
            ours.get(p.phase),
            ours[p.phase] / p.tok_s if p.tok_s and ours.get(p.phase) else None,
            p.note,
        ]
        for p in peer
    ]
    return Table(
        "transformers peer (same shapes, same GPU)",
        ["phase", "transformers tok/s", "sparkinfer tok/s", "speedup", "note"],
        rows,
    )


def plots(decode: list[DecodeRow], prefill: list[PrefillRow]) -> list[Plot]:
    """Aggregate decode against concurrency and prefill against prompt length, with rooflines."""
    decode_plot = Plot(
        "offline-decode.png",
        "Aggregate decode vs concurrency",
        "concurrent requests",
        "tok/s",
        [r.batch for r in decode],
        {
            "sparkinfer": [r.aggregate_tok_s for r in decode],
            "roofline": [r.roofline_tok_s for r in decode],
        },
        is_log_x=True,
    )
    prefill_plot = Plot(
        "offline-prefill.png",
        "Prefill throughput",
        "prompt tokens",
        "tok/s",
        [r.prompt_len for r in prefill],
        {"sparkinfer": [r.tok_s for r in prefill], "roofline": [r.roofline_tok_s for r in prefill]},
        is_log_x=True,
    )
    return [decode_plot, prefill_plot]


def gates(decode: list[DecodeRow], prefill: list[PrefillRow], use_goals: bool) -> list[Gate]:
    errors = sum(r.errors for r in decode)
    gates = [Gate("every request finishes", errors == 0, f"{errors} request(s) ended in error")]
    if use_goals:
        missed = [
            f"decode batch {r.batch}"
            for r in decode
            if (g := _goal_decode(r))
            and (r.stream_tok_s if r.batch == 1 else r.aggregate_tok_s) < g
        ]
        missed += [
            f"prefill {r.prompt_len}" for r in prefill if (g := _goal_prefill(r)) and r.tok_s < g
        ]
        gates.append(Gate("release goals", not missed, f"missed: {missed or 'none'}"))
    return gates
