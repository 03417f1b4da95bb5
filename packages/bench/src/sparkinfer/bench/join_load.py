"""A prompt joining running decodes in the offline engine: its time to first token and the stall
it puts on the streams already decoding.

`streams` requests decode (distinct `context`-token prompts, greedy, ignore_eos); once every one
has produced a few tokens, one more request with a `prompt_len`-token prompt arrives. Its prompt
shares a step with the decode rows, so that step is what every running stream waits on: the
row gives the newcomer's time to first token, the streams' median gap between tokens, and the
longest gap of any stream that spans the newcomer's wait.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field

import numpy as np
import torch
from sparkinfer.bench.report import Table
from sparkinfer.scheduler.request import SamplingParams

_TOKENS_BEFORE_JOIN = 8  # outputs every stream has when the newcomer arrives


@dataclass(frozen=True)
class JoinRow:
    streams: int
    context: int
    prompt_len: int
    ttft_ms: float  # the newcomer's
    itl_median_ms: float  # the running streams' gaps between outputs
    itl_join_max_ms: float  # the longest gap of a running stream across the newcomer's wait


@dataclass
class _Outputs:
    """Arrival times of each request's outputs (filled from the engine thread)."""

    times: dict[str, list[float]] = field(default_factory=dict)
    finished: set[str] = field(default_factory=set)
    errors: list[str] = field(default_factory=list)
    changed: threading.Condition = field(default_factory=threading.Condition)

    def callback(self, request_id: str):
        def on_output(out) -> None:
            now = time.perf_counter()
            with self.changed:
                if out.new_token_ids:
                    self.times.setdefault(request_id, []).append(now)
                if out.is_finished:
                    self.finished.add(request_id)
                    if out.error:
                        self.errors.append(f"{request_id}: {out.error}")
                self.changed.notify_all()

        return on_output

    def wait(self, predicate, what: str, timeout: float = 3600.0) -> None:
        with self.changed:
            if not self.changed.wait_for(lambda: predicate() or self.errors, timeout):
                raise TimeoutError(f"join under load: {what} took over {timeout:.0f} s")
        if self.errors:
            raise RuntimeError(f"join under load: requests failed: {self.errors}")


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
    out = _Outputs()
    params = SamplingParams(temperature=0.0, max_tokens=new_tokens, ignore_eos=True)
    ids = [f"stream-{i}" for i in range(streams)]
    for rid in ids:
        prompt = torch.randint(0, vocab, (context,), generator=gen).tolist()
        engine.add_request(rid, prompt, params, on_output=out.callback(rid))
    out.wait(
        lambda: all(len(out.times.get(r, ())) >= _TOKENS_BEFORE_JOIN for r in ids),
        "the streams' first tokens",
    )
    joined = time.perf_counter()
    prompt = torch.randint(0, vocab, (prompt_len,), generator=gen).tolist()
    newcomer = SamplingParams(temperature=0.0, max_tokens=1, ignore_eos=True)
    engine.add_request("newcomer", prompt, newcomer, on_output=out.callback("newcomer"))
    out.wait(lambda: "newcomer" in out.finished, "the newcomer")
    first = out.times["newcomer"][0]
    out.wait(lambda: all(r in out.finished for r in ids), "the streams")
    gaps, across = [], []
    for rid in ids:
        t = out.times[rid]
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
