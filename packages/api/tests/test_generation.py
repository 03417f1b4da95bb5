"""Choices in the engine: merged events, and aborts for whatever a closed request leaves unread."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncGenerator, Sequence
from typing import Any

import pytest
from sparkinfer.api.engine_client import EngineClient
from sparkinfer.api.generation import ChoiceJob, merge, start_choices
from sparkinfer.model.tokenizer import Tokenizer
from sparkinfer.scheduler.request import FinishReason, RequestOutput, SamplingParams


class RecordingEngine:
    """Takes requests, never runs them; records aborts (the parts of Engine the client uses)."""

    def __init__(self) -> None:
        self.callbacks: dict[str, Any] = {}
        self.aborted: list[str] = []

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
        choices = start_choices(EngineClient(engine), Tokenizer.embedded(), _jobs(num_choices))
        async with contextlib.aclosing(choices):
            pass
        return engine.aborted

    assert sorted(asyncio.run(run())) == [f"req-{i}" for i in range(num_choices)]


def test_finished_choices_are_not_aborted() -> None:
    async def run() -> list[str]:
        engine = RecordingEngine()
        choices = start_choices(EngineClient(engine), Tokenizer.embedded(), _jobs(1))
        done = RequestOutput("req-0", (5,), 2, 1, finish_reason=FinishReason.LENGTH)
        engine.callbacks["req-0"](done)
        async with contextlib.aclosing(choices):
            events = [ev async for ev in choices.events]
        assert [ev.finish_reason for ev in events] == ["length"]
        return engine.aborted

    assert asyncio.run(run()) == []


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
