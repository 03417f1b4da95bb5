"""Single-stream decode speed on the shipped chat/code/math/JSON/repetition prompts (~4K → 128)."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
from sparkinfer.bench import corpus
from sparkinfer.bench.client import GenRequest, OpenAIClient
from sparkinfer.bench.errors import DatasetError
from sparkinfer.bench.report import Plot, Table, log


@dataclass(frozen=True)
class WorkloadRow:
    name: str
    prompt_tokens: int | None
    output_tokens: int  # of the last run
    num_ok: int
    ttft_ms: float | None  # medians over runs
    decode_tok_s: float | None  # (output tokens - 1) / (E2E - TTFT)
    e2e_tok_s: float | None  # output tokens / E2E
    error: str | None

    def as_dict(self) -> dict[str, object]:
        return asdict(self)


def _median(values: list[float]) -> float | None:
    return float(np.median(values)) if values else None


async def run_workloads(
    client: OpenAIClient, names: tuple[str, ...] | None, *, num_runs: int, seed: int
) -> list[WorkloadRow]:
    """Each workload `num_runs` times, greedy, exactly 128 new tokens where the server allows."""
    rows = []
    by_name: dict[str, list] = {}
    for run in range(num_runs):
        for w in corpus.workload_prompts(run, names):
            log(f"workloads: {w.name}, run {run + 1}/{num_runs}")
            req = GenRequest(prompt=w.prompt, max_tokens=w.max_tokens, seed=seed)
            by_name.setdefault(w.name, []).append(await client.generate(req))
    for name, results in by_name.items():
        ok = [r for r in results if r.is_ok and r.ttft_s is not None]
        decode = [
            (r.output_tokens - 1) / (r.e2e_s - r.ttft_s)
            for r in ok
            if r.ttft_s is not None and r.output_tokens > 1 and r.e2e_s > r.ttft_s
        ]
        errors = [r.error for r in results if r.error]
        rows.append(
            WorkloadRow(
                name,
                ok[-1].prompt_tokens if ok else None,
                ok[-1].output_tokens if ok else 0,
                len(ok),
                _median([r.ttft_s * 1e3 for r in ok if r.ttft_s is not None]),
                _median(decode),
                _median([r.output_tokens / r.e2e_s for r in ok]),
                errors[0] if errors else None,
            )
        )
    return rows


def load_baseline(path: Path) -> dict[str, float]:
    """decode tok/s per workload from an earlier `workloads` JSON (e.g. measured against SGLang)."""
    try:
        data = json.loads(path.read_text())
        return {r["name"]: r["decode_tok_s"] for r in data["raw"]["workloads"] if r["decode_tok_s"]}
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise DatasetError(
            f"--baseline {path} is not a workloads.json written by this command ({e})"
        ) from e


def table(rows: list[WorkloadRow], baseline: dict[str, float] | None) -> Table:
    cols = [
        "workload",
        "prompt tokens",
        "output tokens",
        "runs",
        "TTFT ms",
        "decode tok/s",
        "E2E tok/s",
    ]
    if baseline is not None:
        cols += ["baseline tok/s", "delta"]
    out = []
    for r in rows:
        row: list[object] = [
            r.name,
            r.prompt_tokens,
            r.output_tokens,
            r.num_ok,
            r.ttft_ms,
            r.decode_tok_s,
            r.e2e_tok_s,
        ]
        if baseline is not None:
            base = baseline.get(r.name)
            delta = (
                f"{100 * (r.decode_tok_s / base - 1):+.1f}%" if base and r.decode_tok_s else None
            )
            row += [base, delta]
        out.append(row)
    notes = [f"{r.name}: {r.error[:200]}" for r in rows if r.error]
    return Table("workloads (single stream, greedy, medians over runs)", cols, out, notes)


def plot(rows: list[WorkloadRow], baseline: dict[str, float] | None) -> Plot:
    series: dict[str, list[float | None]] = {"this server": [r.decode_tok_s for r in rows]}
    if baseline is not None:
        series["baseline"] = [baseline.get(r.name) for r in rows]
    return Plot(
        "workloads.png",
        "Decode speed per workload",
        "workload",
        "decode tok/s",
        [r.name for r in rows],
        series,
        kind="bar",
    )
