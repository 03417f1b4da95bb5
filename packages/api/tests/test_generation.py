"""Choices in the engine: merged events, and aborts for whatever a closed request leaves unread."""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import AsyncGenerator, Sequence
from typing import Any

import pytest
from sparkinfer.api import engine_client
from sparkinfer.api.engine_client import EngineClient
from sparkinfer.api.generation import ChoiceJob, merge, start_choices
from sparkinfer.model.tokenizer import Tokenizer
from sparkinfer.scheduler.config import SchedulerConfig
from sparkinfer.scheduler.engine import EngineLimits
from sparkinfer.scheduler.request import FinishReason, RequestOutput, SamplingParams


class RecordingEngine:
    """Takes requests, never runs them; records aborts (the parts of Engine the client uses)."""

    def __init__(self) -> None:
        self.callbacks: dict[str, Any] = {}
        self.aborted: list[str] = []
        self.limits = EngineLimits.of(SchedulerConfig())  # no queue limit: all are admitted

    def add_request(
        self, request_id: str, prompt: Sequence[int], params: SamplingParams, **kw: Any
    ) -> None:
        self.callbacks[request_id] = kw["on_output"]

    def abort(self, request_id: str) -> None:
        self.aborted.append(request_id)

    def is_alive(self) -> bool:
        return True


def _jobs(n: int) -> list[ChoiceJob]:
    return [ChoiceJob(i, f"req-{i}", [1, 2], SamplingParams(max_tokens=4)) for i in range(n)]


@pytest.mark.parametrize("num_choices", [1, 3])
def test_closing_unread_choices_aborts_them(num_choices: int) -> None:
    """A request closed before its first event (client gone at once) still frees the engine."""

    async def run() -> list[str]:
        engine = RecordingEngine()
        client = EngineClient(engine)  # pyright: ignore[reportArgumentType]
        choices = await start_choices(client, Tokenizer.embedded(), _jobs(num_choices))
        async with contextlib.aclosing(choices):
            pass
        return engine.aborted

    assert sorted(asyncio.run(run())) == [f"req-{i}" for i in range(num_choices)]


def test_finished_choices_are_not_aborted() -> None:
    async def run() -> list[str]:
        engine = RecordingEngine()
        client = EngineClient(engine)  # pyright: ignore[reportArgumentType]
        choices = await start_choices(client, Tokenizer.embedded(), _jobs(1))
        done = RequestOutput("req-0", (5,), 2, 1, finish_reason=FinishReason.LENGTH)
        engine.callbacks["req-0"](done)
        async with contextlib.aclosing(choices):
            events = [ev async for ev in choices.events]
        assert [ev.finish_reason for ev in events] == ["length"]
        return engine.aborted

    assert asyncio.run(run()) == []


class BlockingEngine(RecordingEngine):
    """Blocks in add_request until released, as a long prompt's checks and hashes would."""

    def __init__(self) -> None:
        super().__init__()
        self.entered, self.release = threading.Event(), threading.Event()

    def add_request(
        self, request_id: str, prompt: Sequence[int], params: SamplingParams, **kw: Any
    ) -> None:
        self.entered.set()
        self.release.wait(30)
        super().add_request(request_id, prompt, params, **kw)


def test_a_request_cancelled_while_a_worker_queues_it_is_aborted(monkeypatch) -> None:
    """The client leaves while its long prompts are being queued on a worker thread: once the
    worker has queued them, the engine aborts every one."""
    monkeypatch.setattr(engine_client, "INLINE_SUBMIT_TOKENS", 0)
    engine = BlockingEngine()
    client = EngineClient(engine)  # pyright: ignore[reportArgumentType]

    async def run() -> None:
        jobs = [(f"req-{i}", [1, 2], SamplingParams(max_tokens=4), None) for i in range(2)]
        task = asyncio.ensure_future(client.submit_all(jobs))
        await asyncio.get_running_loop().run_in_executor(None, engine.entered.wait, 30)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        engine.release.set()
        for _ in range(500):  # the worker finishes, then its done-callback runs on this loop
            if len(engine.aborted) == 2:
                return
            await asyncio.sleep(0.01)

    asyncio.run(run())
    assert sorted(engine.aborted) == ["req-0", "req-1"]


@pytest.mark.parametrize("num_sources", [1, 2])
def test_closing_the_merge_closes_its_sources_at_once(num_sources: int) -> None:
    closed: list[int] = []

    async def source(i: int) -> AsyncGenerator[Any, None]:
        try:
            while True:
                yield i
                await asyncio.sleep(0)
        finally:
            closed.append(i)

    async def run() -> list[int]:
        merged = merge([source(i) for i in range(num_sources)])
        await anext(merged)
        await merged.aclose()
        return sorted(closed)  # before any other task of the loop has run

    assert asyncio.run(run()) == list(range(num_sources))
