"""Prefix reuse in the offline engine: sequential requests that share a long prefix, cold vs warm.

Request 1 prefills the whole prompt (prefix + its own question); the prefix cache keeps the GDN
state at its last checkpoint, so requests 2.. prefill only past it. Each request's time to first
token and the prompt tokens the engine served from the cache (its `num_prefix_cached_tokens`) go
in one row. The HTTP counterpart is the `prefix_cache` eval (any OpenAI-compatible server).
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import torch
from sparkinfer.bench.report import Gate, Table
from sparkinfer.scheduler.request import SamplingParams


@dataclass(frozen=True)
class PrefixReuseRow:
    request: int  # 1 is the cold one
    prompt_len: int
    prefix_len: int  # tokens shared with the requests before it
    cached_tokens: int  # prompt tokens the engine served from the prefix cache
    ttft_ms: float


def measure_prefix_reuse(
    engine, *, prefix_len: int, suffix_len: int, num_requests: int, vocab: int, seed: int
) -> list[PrefixReuseRow]:
    """`num_requests` prompts of a shared random `prefix_len`-token prefix and distinct
    `suffix_len`-token questions, one after the other, max_tokens 1 (greedy): its one token is
    its first, so the request's wall clock is its time to first token."""
    gen = torch.Generator().manual_seed(seed)
    prefix = torch.randint(0, vocab, (prefix_len,), generator=gen).tolist()
    params = SamplingParams(temperature=0.0, max_tokens=1, ignore_eos=True)
    rows = []
    for i in range(num_requests):
        prompt = prefix + torch.randint(0, vocab, (suffix_len,), generator=gen).tolist()
        cached_before = engine.stats().num_prefix_cached_tokens
        start = time.perf_counter()
        engine.generate(prompt, params, timeout=3600)
        ttft_ms = (time.perf_counter() - start) * 1e3
        cached = engine.stats().num_prefix_cached_tokens - cached_before
        rows.append(PrefixReuseRow(i + 1, len(prompt), prefix_len if i else 0, cached, ttft_ms))
    return rows


def table(rows: list[PrefixReuseRow], snapshots: int) -> Table:
    first = rows[0].ttft_ms if rows else float("nan")
    return Table(
        f"prefix reuse (prefix cache on, {snapshots} snapshots; sequential, max_tokens 1)",
        ["request", "prompt tokens", "shared prefix", "cached tokens", "TTFT ms", "vs first"],
        [
            [r.request, r.prompt_len, r.prefix_len, r.cached_tokens, r.ttft_ms, first / r.ttft_ms]
            for r in rows
        ],
        [
            "cached tokens: the prompt's tokens served from a snapshot (up to a checkpoint within "
            "the shared prefix); the rest is prefilled"
        ],
    )


def gate(rows: list[PrefixReuseRow]) -> Gate:
    """Every request after the first reuses the shared prefix."""
    misses = [r.request for r in rows[1:] if r.cached_tokens == 0]
    return Gate("prefix cache hit after the first request", not misses, f"misses: {misses}")
