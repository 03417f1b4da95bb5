"""Prefill over HTTP: TTFT and prompt tokens per second vs prompt length, one token out."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from sparkinfer.bench import corpus
from sparkinfer.bench.calibration import tokens_per_word
from sparkinfer.bench.client import GenRequest, OpenAIClient
from sparkinfer.bench.report import Plot, Table, log

DEFAULT_LENGTHS = (1024, 2048, 4096, 8192, 16384, 32768, 65536, 131072, 262144)


@dataclass(frozen=True)
class PrefillRow:
    target_len: int
    prompt_tokens: int | None  # as the server counted them
    ttft_ms_median: float | None
    ttft_ms_p90: float | None
    prefill_tok_s: float | None  # prompt tokens / median TTFT
    num_ok: int
    error: str | None


async def measure(
    client: OpenAIClient, lengths: Sequence[int], *, num_iters: int, seed: int
) -> list[PrefillRow]:
    """One warm-up then `num_iters` sequential requests per length, each with a fresh prompt."""
    tpw = await tokens_per_word(client, seed)
    rows: list[PrefillRow] = []
    idx = 0
    for n in lengths:
        log(f"prefill: {n} tokens x {num_iters}")
        ttfts, counts, error = [], [], None
        for i in range(num_iters + 1):
            prompt = corpus.random_prompt(n, 2 * 10**6 + idx, seed, tpw)
            idx += 1
            res = await client.generate(GenRequest(prompt=prompt, max_tokens=1, is_fixed_len=False))
            if res.error:
                error = res.error
                break
            if i > 0 and res.ttft_s is not None:  # the first request of each length warms up
                ttfts.append(res.ttft_s * 1e3)
                counts.append(res.prompt_tokens)
        tokens = counts[0] if counts and counts[0] is not None else (n if ttfts else None)
        median = float(np.median(ttfts)) if ttfts else None
        rows.append(
            PrefillRow(
                n,
                tokens,
                median,
                float(np.percentile(ttfts, 90)) if ttfts else None,
                tokens / (median / 1e3) if median and tokens else None,
                len(ttfts),
                error,
            )
        )
        if error:
            log(f"prefill: {n} tokens failed ({error[:120]}); longer prompts skipped")
            break
    return rows


def table(rows: list[PrefillRow]) -> Table:
    return Table(
        "prefill (max_tokens 1)",
        [
            "target len",
            "prompt tokens",
            "runs",
            "TTFT p50 ms",
            "TTFT p90 ms",
            "prefill tok/s",
            "error",
        ],
        [
            [
                r.target_len,
                r.prompt_tokens,
                r.num_ok,
                r.ttft_ms_median,
                r.ttft_ms_p90,
                r.prefill_tok_s,
                (r.error or "")[:60],
            ]
            for r in rows
        ],
    )


def plots(rows: list[PrefillRow]) -> list[Plot]:
    ok = [r for r in rows if r.ttft_ms_median is not None]
    x = [r.prompt_tokens or r.target_len for r in ok]
    return [
        Plot(
            "prefill-throughput.png",
            "Prefill throughput",
            "prompt tokens",
            "prompt tok/s",
            x,
            {"prefill tok/s": [r.prefill_tok_s for r in ok]},
            is_log_x=True,
        ),
        Plot(
            "prefill-ttft.png",
            "Time to first token",
            "prompt tokens",
            "TTFT ms",
            x,
            {"p50": [r.ttft_ms_median for r in ok], "p90": [r.ttft_ms_p90 for r in ok]},
            is_log_x=True,
            is_log_y=True,
        ),
    ]
