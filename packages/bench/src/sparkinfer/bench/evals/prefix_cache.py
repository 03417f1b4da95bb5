"""Prefix reuse: wall clock of sequential requests that share a long prefix, cold vs warm.

Order: an unrelated warm-up request (so start-up costs are not mistaken for cache misses), then the
shared prefix `num_requests` times with different questions, then a control with a different prefix
of the same length (cold again). Speedup = mean cold / mean warm wall clock; a server without a
prefix cache shows about 1.0x and the report says so.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

import numpy as np
from sparkinfer.bench import corpus
from sparkinfer.bench.calibration import chars_per_token
from sparkinfer.bench.client import GenRequest, OpenAIClient
from sparkinfer.bench.report import Plot, Table, log

QUESTIONS = (
    "Who carried the lantern, and where?",
    "Name two places the story mentions.",
    "Which character seems most stubborn?",
    "What was the weather like in the last paragraph?",
    "Who kept something in a drawer?",
    "What did somebody leave by the well?",
)
# Below this ratio the report says the server showed no useful prefix reuse.
SPEEDUP_THRESHOLD = 1.5


@dataclass(frozen=True)
class PrefixRow:
    label: str  # "cold", "warm", "control (cold)"
    wall_s: float | None
    ttft_s: float | None
    prompt_tokens: int | None
    cached_tokens: int | None
    error: str | None

    def as_dict(self) -> dict[str, object]:
        return asdict(self)


def _prompt(prefix: str, question_idx: int) -> str:
    question = QUESTIONS[question_idx % len(QUESTIONS)]
    return f"{prefix}\n\nQuestion {question_idx + 1}: {question} Answer in one sentence."


async def run_prefix_cache(
    client: OpenAIClient, *, prefix_tokens: int, num_requests: int, max_tokens: int, seed: int
) -> list[PrefixRow]:
    cpt = await chars_per_token(client)
    num_chars = int(prefix_tokens * cpt)
    # A run-unique opener keeps earlier runs' cache entries from making request 1 look warm.
    shared = f"{corpus.unique_prefix(1, seed)}\n{corpus.prose(num_chars)}"
    control = f"{corpus.unique_prefix(2, seed)}\n{corpus.prose(num_chars + 2000)[2000:]}"
    await client.generate(GenRequest(prompt=corpus.unique_prefix(3, seed), max_tokens=4))
    plan = [("cold" if i == 0 else "warm", shared, i) for i in range(num_requests)]
    plan.append(("control (cold)", control, 0))
    rows = []
    for label, prefix, q in plan:
        log(f"prefix-cache: {label} request ({prefix_tokens} prefix tokens)")
        r = await client.generate(
            GenRequest(prompt=_prompt(prefix, q), max_tokens=max_tokens, seed=seed)
        )
        rows.append(
            PrefixRow(
                label,
                r.e2e_s if r.is_ok else None,
                r.ttft_s,
                r.prompt_tokens,
                r.cached_tokens,
                r.error,
            )
        )
    return rows


def speedup(rows: list[PrefixRow]) -> float | None:
    cold = [r.wall_s for r in rows if r.label != "warm" and r.wall_s is not None]
    warm = [r.wall_s for r in rows if r.label == "warm" and r.wall_s is not None]
    if not cold or not warm:
        return None
    return float(np.mean(cold) / np.mean(warm))


def table(rows: list[PrefixRow]) -> Table:
    ratio = speedup(rows)
    if ratio is None:
        verdict = "no speedup measured: a request failed or only one shared request was sent"
    elif ratio < SPEEDUP_THRESHOLD:
        verdict = f"no prefix-cache speedup: cold/warm = {ratio:.2f}x (the server re-prefills)"
    else:
        verdict = f"prefix reuse: warm requests are {ratio:.2f}x faster than cold ones"
    return Table(
        "prefix cache (sequential requests, shared prefix then a different-prefix control)",
        ["request", "kind", "wall s", "TTFT s", "prompt tokens", "cached tokens", "error"],
        [
            [
                i + 1,
                r.label,
                r.wall_s,
                r.ttft_s,
                r.prompt_tokens,
                r.cached_tokens,
                (r.error or "")[:60],
            ]
            for i, r in enumerate(rows)
        ],
        [verdict],
    )


def plot(rows: list[PrefixRow]) -> Plot:
    return Plot(
        "prefix-cache.png",
        "Wall clock per request",
        "request",
        "seconds",
        [f"{i + 1} {r.label}" for i, r in enumerate(rows)],
        {"wall s": [r.wall_s for r in rows]},
        kind="bar",
    )
