"""Tensor parallel on the CPU: rank 0 in this process, rank 1 spawned, gloo between them.

The TP=2 engine over the embedded checkpoint against the TP=1 engine: greedy tokens identical and
their logprobs equal within fp32 tolerance, under continuous batching, prefix-cache hits and
aborts; a rank that dies fails the engine's requests with a message naming it, without a hang.
"""

from __future__ import annotations

import multiprocessing
import os
import signal
import threading
import time
from collections.abc import Iterator
from typing import NamedTuple

import pytest
import torch
from sparkinfer.model import embedded
from sparkinfer.model.weights import load_model
from sparkinfer.scheduler.config import SchedulerConfig
from sparkinfer.scheduler.distributed.launch import (
    CheckpointShards,
    ModelSource,
    start_tensor_parallel_engine,
)
from sparkinfer.scheduler.engine import Engine
from sparkinfer.scheduler.request import FinishReason, RequestOutput, SamplingParams

CONFIG = SchedulerConfig(
    max_num_seqs=4,
    max_model_len=512,
    block_size=16,
    num_kv_blocks=96,
    num_state_slots=6,
    prefix_cache_snapshots=2,
    prefix_cache_min_tokens=128,
)
GREEDY = SamplingParams(temperature=0.0, max_tokens=10, logprobs=0, ignore_eos=True)
LOGPROB_ATOL = 1e-4
PROMPTS = [
    [5, 100, 200, 300],
    list(range(40, 90)),
    [7] * 3 + list(range(1000, 1030)),
    list(range(2000, 2300)),  # long enough for a prefix-cache snapshot
]


def _source() -> ModelSource:
    loader = CheckpointShards(str(embedded.embedded_checkpoint_dir()), "float32")
    return ModelSource(loader, "cpu")


@pytest.fixture(scope="module")
def whole() -> Iterator[Engine]:
    model = load_model(embedded.embedded_checkpoint_dir(), device="cpu", dtype=torch.float32)
    engine = Engine.from_model(model, CONFIG, device="cpu")
    yield engine
    engine.shutdown()


class Split(NamedTuple):
    """The TP=2 engine and the messages of its ranks that exited."""

    engine: Engine
    exits: list[str]


@pytest.fixture(scope="module")
def split_ranks() -> Iterator[Split]:
    exits: list[str] = []
    engine = start_tensor_parallel_engine(_source(), CONFIG, size=2, on_rank_exit=exits.append)
    yield Split(engine, exits)
    engine.shutdown()


@pytest.fixture
def split(split_ranks: Split) -> Engine:
    return split_ranks.engine


class Collector:
    """Gathers one request's outputs; `done` is set when it finishes."""

    def __init__(self) -> None:
        self.tokens: list[int] = []
        self.logprobs: list[float] = []
        self.final: RequestOutput | None = None
        self.done = threading.Event()

    def __call__(self, out: RequestOutput) -> None:
        self.tokens.extend(out.new_token_ids)
        self.logprobs.extend(lp.logprob for lp in out.logprobs)
        if out.is_finished:
            self.final = out
            self.done.set()


def run_all(engine: Engine, prompts: list[list[int]], *, stagger_s: float = 0.0) -> list[Collector]:
    """Submit every prompt (waiting `stagger_s` between them, so later ones join a running batch)
    and wait for all."""
    outs = [Collector() for _ in prompts]
    for i, (prompt, out) in enumerate(zip(prompts, outs, strict=True)):
        engine.add_request(f"r{time.monotonic_ns()}-{i}", prompt, GREEDY, on_output=out)
        time.sleep(stagger_s)
    for out in outs:
        assert out.done.wait(60), "a request did not finish"
    return outs


def assert_same(got: list[Collector], expected: list[Collector]) -> None:
    for g, e in zip(got, expected, strict=True):
        assert g.tokens == e.tokens
        torch.testing.assert_close(
            torch.tensor(g.logprobs), torch.tensor(e.logprobs), atol=LOGPROB_ATOL, rtol=0
        )


def test_two_ranks_match_one_in_a_batch(whole: Engine, split: Engine) -> None:
    assert_same(run_all(split, PROMPTS), run_all(whole, PROMPTS))


def test_two_ranks_match_one_when_requests_join_a_running_batch(
    whole: Engine, split: Engine
) -> None:
    assert_same(run_all(split, PROMPTS, stagger_s=0.05), run_all(whole, PROMPTS))


def test_two_ranks_reuse_a_cached_prefix(whole: Engine, split: Engine) -> None:
    prompt = [*PROMPTS[3][:256], 11, 12, 13]
    first = run_all(split, [prompt])
    second = run_all(split, [prompt])
    assert second[0].final is not None and second[0].final.num_cached_tokens >= 128
    assert_same(first, run_all(whole, [prompt]))
    assert_same(second, first)


def test_two_ranks_abort_one_request_and_serve_the_rest(whole: Engine, split: Engine) -> None:
    long = Collector()
    params = SamplingParams(temperature=0.0, max_tokens=400, ignore_eos=True)
    split.add_request("long", PROMPTS[0], params, on_output=long)
    while not long.tokens:
        time.sleep(0.01)
    split.abort("long")
    assert long.done.wait(30)
    assert long.final is not None and long.final.finish_reason is FinishReason.ABORT
    assert_same(run_all(split, PROMPTS[:2]), run_all(whole, PROMPTS[:2]))


def test_one_rank_runs_no_collective(monkeypatch: pytest.MonkeyPatch) -> None:
    """At size 1 the engine holds the plain model: not one torch.distributed call."""

    def refuse(*args: object, **kwargs: object) -> None:
        raise AssertionError("a collective ran at tensor_parallel_size 1")

    for name in ("all_reduce", "all_gather", "broadcast", "broadcast_object_list"):
        monkeypatch.setattr(torch.distributed, name, refuse)
    model = load_model(embedded.embedded_checkpoint_dir(), device="cpu", dtype=torch.float32)
    engine = Engine.from_model(model, CONFIG, device="cpu")
    try:
        assert len(engine.generate(PROMPTS[0], GREEDY)) == GREEDY.max_tokens
    finally:
        engine.shutdown()


def test_a_rank_that_dies_fails_the_engine_with_a_clear_error(split_ranks: Split) -> None:
    """Last in this module: it kills the module's rank 1."""
    engine, exits = split_ranks
    out = Collector()
    params = SamplingParams(temperature=0.0, max_tokens=400, ignore_eos=True)
    engine.add_request("doomed", PROMPTS[1], params, on_output=out)
    while not out.tokens:
        time.sleep(0.01)
    (rank1,) = [p for p in multiprocessing.active_children() if p.name.endswith("rank-1")]
    assert rank1.pid is not None
    os.kill(rank1.pid, signal.SIGKILL)
    assert out.done.wait(30), "the request hung after its rank died"
    assert out.final is not None and out.final.finish_reason is FinishReason.ERROR
    deadline = time.monotonic() + 10
    while not exits and time.monotonic() < deadline:
        time.sleep(0.05)
    assert exits and "tensor-parallel rank 1" in exits[0] and "restart" in exits[0]
    with pytest.raises(RuntimeError, match="tensor-parallel rank 1"):
        engine.generate([1, 2], GREEDY, timeout=30)
