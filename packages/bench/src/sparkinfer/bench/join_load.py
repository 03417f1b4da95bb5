"""A prompt joining running decodes in the offline engine: its time to first token and the stall
it puts on the streams already decoding.

`streams` requests decode (distinct `context`-token prompts, greedy, ignore_eos); once every one
has produced a few tokens, one more request with a `prompt_len`-token prompt arrives. Its prompt
shares a step with the decode rows, so that step is what every running stream waits on: the
row gives the newcomer's time to first token, the streams' median gap between tokens, and the
longest gap of any stream that spans the newcomer's wait.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np
import torch
from sparkinfer.bench.report import Table
from sparkinfer.bench.tracker import OutputTracker
from sparkinfer.scheduler.request import SamplingParams

_TOKENS_BEFORE_JOIN = 8  # outputs every stream has when the newcomer arrives
_TIMEOUT_S = 3600.0


@dataclass(frozen=True)
class JoinRow:
    streams: int
    context: int
    prompt_len: int
    ttft_ms: float  # the newcomer's
    itl_median_ms: float  # the running streams' gaps between outputs
    itl_join_max_ms: float  # the longest gap of a running stream across the newcomer's wait


def measure_join(
    engine,
    *,
    streams: int,
    context: int,
    prompt_len: int,
    new_tokens: int,
    vocab: int,
    seed: int,
) -> JoinRow:
    """One newcomer of `prompt_len` tokens joining `streams` decoding requests (module
    docstring); `new_tokens` per stream, enough to decode well past the join."""
    if new_tokens <= 2 * _TOKENS_BEFORE_JOIN:
        raise ValueError(f"new_tokens is {new_tokens}; expected > {2 * _TOKENS_BEFORE_JOIN}")
    gen = torch.Generator().manual_seed(seed)
    out = OutputTracker(num_left=streams + 1)
    params = SamplingParams(temperature=0.0, max_tokens=new_tokens, ignore_eos=True)
    ids = [f"stream-{i}" for i in range(streams)]
    for rid in ids:
        prompt = torch.randint(0, vocab, (context,), generator=gen).tolist()
        engine.add_request(rid, prompt, params, on_output=out.callback(rid))
    out.wait_for(
        lambda: all(len(out.events.get(r, ())) >= _TOKENS_BEFORE_JOIN for r in ids),
        "join under load: the streams' first tokens",
        _TIMEOUT_S,
    )
    joined = time.perf_counter()
    prompt = torch.randint(0, vocab, (prompt_len,), generator=gen).tolist()
    newcomer = SamplingParams(temperature=0.0, max_tokens=1, ignore_eos=True)
    engine.add_request("newcomer", prompt, newcomer, on_output=out.callback("newcomer"))
    out.wait_for(lambda: "newcomer" in out.finished, "join under load: the newcomer", _TIMEOUT_S)
    first = out.times("newcomer")[0]
    out.wait_for(out.done.is_set, "join under load: the streams", _TIMEOUT_S)
    gaps, across = [], []
    for rid in ids:
        t = out.times(rid)
        for a, b in zip(t[_TOKENS_BEFORE_JOIN - 1 :], t[_TOKENS_BEFORE_JOIN:], strict=False):
            (across if a < first and b > joined else gaps).append(b - a)
    return JoinRow(
        streams,
        context,
        prompt_len,
        (first - joined) * 1e3,
        float(np.median(gaps)) * 1e3 if gaps else float("nan"),
        max(across) * 1e3 if across else float("nan"),
    )


_COLUMNS = [
    "streams",
    "context",
    "prompt tokens",
    "newcomer TTFT ms",
    "stream gap p50 ms",
    "longest stream gap across the join ms",
]


def table(rows: list[JoinRow]) -> Table:
    return Table(
        "a prompt joining running decodes (greedy; the newcomer asks for one token)",
        _COLUMNS,
        [
            [r.streams, r.context, r.prompt_len, r.ttft_ms, r.itl_median_ms, r.itl_join_max_ms]
            for r in rows
        ],
        [
            "stream gap: time between a running stream's outputs, away from the join; across the "
            "join: the longest one that spans the newcomer's wait for its first token"
        ],
    )
