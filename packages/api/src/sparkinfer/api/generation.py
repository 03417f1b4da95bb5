"""One choice's generation: engine outputs → text deltas (stop strings cut), logprobs, finish."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncGenerator, AsyncIterator, Coroutine, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

from fastapi import Request
from sparkinfer.api.engine_client import EngineClient, RequestStream
from sparkinfer.api.errors import InternalError
from sparkinfer.api.request_ids import request_id
from sparkinfer.api.stops import StopStringMatcher
from sparkinfer.model.tokenizer import IncrementalDetokenizer, Tokenizer
from sparkinfer.scheduler.request import (
    FinishReason,
    MultimodalInputs,
    RequestMetrics,
    SamplingParams,
    TokenLogprob,
)

logger = logging.getLogger("sparkinfer.api")
T = TypeVar("T")
CLIENT_CLOSED_REQUEST = 499  # the status logged for a client that left (nobody receives it)


class EngineFailure(InternalError):
    """The engine ended a request with an error (the details are in the server log)."""


@dataclass
class ChoiceEvent:
    """What one engine step added to one choice."""

    index: int
    text: str
    token_ids: tuple[int, ...]
    logprobs: tuple[TokenLogprob, ...] = ()
    finish_reason: str | None = None
    prompt_logprobs: tuple[TokenLogprob, ...] = ()  # on a choice's first event, when asked for
    stop_string: str | None = None  # the stop string that ended the choice, on its last event


@dataclass
class ChoiceResult:
    """A finished choice's counters and telemetry, for usage."""

    num_prompt_tokens: int = 0
    num_output_tokens: int = 0
    num_cached_tokens: int = 0
    metrics: RequestMetrics = field(default_factory=RequestMetrics)


@dataclass(frozen=True)
class ChoiceJob:
    """Everything needed to run one choice in the engine."""

    index: int
    request_id: str
    prompt_token_ids: Sequence[int]
    params: SamplingParams
    stops: Sequence[str] = ()
    multimodal: MultimodalInputs | None = None  # the prompt's images and videos


_FINISH = {FinishReason.STOP: "stop", FinishReason.LENGTH: "length", FinishReason.ABORT: "abort"}


async def run_choice(
    client: EngineClient,
    tokenizer: Tokenizer,
    job: ChoiceJob,
    *,
    stream: RequestStream,
    result: ChoiceResult,
) -> AsyncGenerator[ChoiceEvent, None]:
    """Stream one choice; a stop string ends it early (trimmed) and aborts the engine request."""
    detok = IncrementalDetokenizer(tokenizer, skip_special=True)
    stops = StopStringMatcher(job.stops)
    try:
        async for out in stream:
            result.num_prompt_tokens = out.num_prompt_tokens
            result.num_output_tokens = out.num_output_tokens
            result.num_cached_tokens = out.num_cached_tokens
            text = stops.feed(detok.push(out.new_token_ids))
            if stops.is_stopped:
                client.abort_all([stream], reason="stop")  # counted as the stop it is
                yield ChoiceEvent(
                    job.index, text, out.new_token_ids, out.logprobs, "stop", out.prompt_logprobs,
                    stops.matched,
                )  # fmt: skip
                return
            if out.finish_reason is FinishReason.ERROR:
                logger.error("request %s: the engine failed it: %s", job.request_id, out.error)
                raise EngineFailure(
                    f"the engine failed request {job.request_id}; the cause is in the server log "
                    "under that id"
                )
            finish = None if out.finish_reason is None else _FINISH[out.finish_reason]
            if finish is not None:
                result.metrics = out.metrics
                text += stops.feed(detok.finish()) + stops.flush()
                if stops.is_stopped:
                    finish = "stop"
            if text or out.new_token_ids or finish:
                yield ChoiceEvent(
                    job.index, text, out.new_token_ids, out.logprobs, finish, out.prompt_logprobs,
                    stops.matched if finish == "stop" else None,
                )  # fmt: skip
    finally:
        client.abort_all([stream])  # no-op once finished; else the engine frees it now


@dataclass
class Choices:
    """A request's queued choices: their merged events and results, filled as events come."""

    events: AsyncGenerator[ChoiceEvent, None]
    results: list[ChoiceResult]
    client: EngineClient
    streams: list[RequestStream]

    async def aclose(self) -> None:
        """Stop reading and abort every unfinished choice, read from or not (client gone, error)."""
        try:
            await self.events.aclose()
        finally:
            self.client.abort_all(self.streams)


async def start_choices(
    client: EngineClient, tokenizer: Tokenizer, jobs: Sequence[ChoiceJob]
) -> Choices:
    """Queue every choice now (errors such as QueueFull surface before any response starts).

    The caller reads `events` inside `contextlib.aclosing(choices)`, so that whatever it leaves
    unread, even before the first event, is aborted in the engine.
    """
    streams = await client.submit_all(
        [(j.request_id, j.prompt_token_ids, j.params, j.multimodal) for j in jobs]
    )
    results = [ChoiceResult() for _ in jobs]
    events = merge(
        [
            run_choice(client, tokenizer, job, stream=stream, result=result)
            for job, stream, result in zip(jobs, streams, results, strict=True)
        ]
    )
    return Choices(events, results, client, streams)


async def merge(
    streams: Sequence[AsyncGenerator[ChoiceEvent, None]],
) -> AsyncGenerator[ChoiceEvent, None]:
    """Interleave several choices' events as they come; an error in one ends all of them.

    Closing the merged generator closes every source now (their `finally` blocks abort them).
    """
    if len(streams) == 1:
        async with contextlib.aclosing(streams[0]) as only:
            async for event in only:
                yield event
        return
    queue: asyncio.Queue[ChoiceEvent | BaseException | None] = asyncio.Queue()

    async def pump(it: AsyncIterator[ChoiceEvent]) -> None:
        """Forward `it`'s events to the queue, then None (finished) or its exception."""
        try:
            async for event in it:
                await queue.put(event)
            await queue.put(None)
        except BaseException as exc:  # handed to the reader, which re-raises it
            await queue.put(exc)

    tasks = [asyncio.ensure_future(pump(s)) for s in streams]
    try:
        num_open = len(tasks)
        while num_open:
            item = await queue.get()
            if item is None:
                num_open -= 1
            elif isinstance(item, BaseException):
                raise item
            else:
                yield item
    finally:
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task


async def unless_disconnected(request: Request, work: Coroutine[Any, Any, T]) -> T | None:
    """Await `work`, or cancel it and return None once the client disconnects.

    A whole (non-streamed) response is only sent at the end, so without this a client that
    gave up would keep its choices generating; cancelling `work` closes its `Choices`.
    """
    task = asyncio.ensure_future(work)
    listener = asyncio.ensure_future(_disconnected(request))
    try:
        await asyncio.wait({task, listener}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for pending in (listener, task):
            if not pending.done():
                pending.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await pending
    if task.cancelled():
        logger.info("request %s: the client disconnected before the answer", request_id(request))
        return None
    return task.result()


async def _disconnected(request: Request) -> None:
    """Return when the client disconnects (the body has been read: nothing else comes)."""
    while (await request.receive())["type"] != "http.disconnect":
        pass
