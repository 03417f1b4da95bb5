"""The bridge between the engine thread and asyncio: one queue per request, fed thread-safely."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
import weakref
from collections.abc import Sequence

from sparkinfer.api.errors import InvalidRequest
from sparkinfer.api.metrics import ServerMetrics
from sparkinfer.scheduler.engine import Engine
from sparkinfer.scheduler.errors import EngineStopped
from sparkinfer.scheduler.request import (
    FinishReason,
    MultimodalInputs,
    RequestOutput,
    SamplingParams,
)

logger = logging.getLogger("sparkinfer.api")

# A request's prompts up to this many tokens in all are queued from the event loop; longer ones
# from a worker thread (the engine's checks and prefix hashes grow with the prompt).
INLINE_SUBMIT_TOKENS = 4096


class RequestStream:
    """The outputs of one engine request, delivered to one asyncio task in order.

    The engine thread calls `put`; the event loop reads with `async for`, which ends after the
    output that carries a finish reason. Reading also feeds the latency histograms.
    """

    def __init__(
        self, request_id: str, loop: asyncio.AbstractEventLoop, metrics: ServerMetrics | None
    ) -> None:
        self.request_id = request_id
        self._loop = loop
        self._queue: asyncio.Queue[RequestOutput | BaseException] = asyncio.Queue()
        self._metrics = metrics
        self.is_finished = False
        self.arrival_time = time.monotonic()
        self._last_time: float | None = None

    def put(self, out: RequestOutput) -> None:
        """Called from the engine thread after each step that produced output for this request."""
        with contextlib.suppress(RuntimeError):  # the loop is closed: nobody is listening
            self._loop.call_soon_threadsafe(self._queue.put_nowait, out)

    def fail(self, exc: BaseException) -> None:
        """End the stream with `exc`, raised to its reader (thread-safe); the reader's abort
        then frees the engine request."""
        with contextlib.suppress(RuntimeError):  # the loop is closed: nobody is listening
            self._loop.call_soon_threadsafe(self._queue.put_nowait, exc)

    def __aiter__(self) -> RequestStream:
        return self

    async def __anext__(self) -> RequestOutput:
        if self.is_finished:
            raise StopAsyncIteration
        out = await self._queue.get()
        if isinstance(out, BaseException):
            raise out
        self.is_finished = out.is_finished
        self._observe(out)
        return out

    def _observe(self, out: RequestOutput) -> None:
        m = self._metrics
        if m is None:
            return
        now = time.monotonic()
        if out.new_token_ids:
            if self._last_time is None:
                m.ttft.observe(now - self.arrival_time)
            else:
                m.inter_token.observe(now - self._last_time)
            self._last_time = now
            m.generation_tokens.inc(len(out.new_token_ids))
        if out.is_finished:
            m.e2e.observe(now - self.arrival_time)
            m.prompt_tokens.inc(out.num_prompt_tokens)
            m.cached_tokens.inc(out.num_cached_tokens)
            reason = out.finish_reason or FinishReason.ERROR
            m.requests.labels(finish_reason=reason.value).inc()


class EngineClient:
    """Submits requests to the `Engine` and hands back `RequestStream`s; aborts abandoned ones."""

    def __init__(self, engine: Engine, metrics: ServerMetrics | None = None) -> None:
        self.engine = engine
        self.metrics = metrics
        self._is_stopped = False
        self._streams: weakref.WeakSet[RequestStream] = weakref.WeakSet()  # those handed out

    def is_alive(self) -> bool:
        """False once the engine was shut down, its loop died, or it refused a request."""
        return not self._is_stopped and self.engine.is_alive()

    def shutdown(self) -> None:
        self._is_stopped = True
        self.engine.shutdown()

    def end_all(self, exc: BaseException) -> None:
        """End every unfinished stream with `exc` (the end of a shutdown's drain)."""
        for stream in list(self._streams):
            if not stream.is_finished:
                stream.fail(exc)

    async def submit(
        self,
        request_id: str,
        prompt_token_ids: Sequence[int],
        params: SamplingParams,
        *,
        multimodal: MultimodalInputs | None = None,
    ) -> RequestStream:
        """Queue a request and return its stream (thread-safe hand-off to the engine).

        Raises the engine's `QueueFull` / `ContextLengthExceeded` / `InvalidRequest` before
        anything is queued, so the route can still answer with a plain error status.
        """
        (stream,) = await self.submit_all([(request_id, prompt_token_ids, params, multimodal)])
        return stream

    async def submit_all(
        self,
        jobs: Sequence[tuple[str, Sequence[int], SamplingParams, MultimodalInputs | None]],
    ) -> list[RequestStream]:
        """Submit several requests; if one is refused, abort the ones already queued.

        The engine checks each prompt and hashes its blocks for the prefix cache as it queues
        it, in time linear in its length: prompts of over INLINE_SUBMIT_TOKENS tokens in all
        are queued from a worker thread, so the event loop keeps serving everyone else.
        """
        self._check_fits(len(jobs))
        loop = asyncio.get_running_loop()
        if sum(len(prompt) for _, prompt, _, _ in jobs) <= INLINE_SUBMIT_TOKENS:
            return self._submit_all(loop, jobs)
        pending = loop.run_in_executor(None, self._submit_all, loop, jobs)
        try:
            return await asyncio.shield(pending)
        except asyncio.CancelledError:  # the client left: abort what the worker queues
            pending.add_done_callback(self._abort_submitted)
            raise

    def _check_fits(self, num_jobs: int) -> None:
        """400 for more choices than free seats plus the queue could ever take: a 429's retry
        would never succeed."""
        limits = self.engine.limits
        depth, seats = limits.max_queue_depth, limits.max_seqs_per_step
        if depth and num_jobs > seats + depth:
            raise InvalidRequest(
                f"the request has {num_jobs} choices (prompts x n); at most {seats + depth} are "
                f"ever admitted at once ({seats} sequences per step + max_queue_depth {depth}): "
                "lower n or send fewer prompts per request",
                param="n",
            )

    def _abort_submitted(self, done: asyncio.Future[list[RequestStream]]) -> None:
        if not done.cancelled() and done.exception() is None:
            self.abort_all(done.result())

    def _submit_all(
        self,
        loop: asyncio.AbstractEventLoop,
        jobs: Sequence[tuple[str, Sequence[int], SamplingParams, MultimodalInputs | None]],
    ) -> list[RequestStream]:
        streams: list[RequestStream] = []
        try:
            for request_id, prompt, params, multimodal in jobs:
                stream = RequestStream(request_id, loop, self.metrics)
                self._add(stream, prompt, params, multimodal)
                streams.append(stream)
                self._streams.add(stream)
        except BaseException:
            self.abort_all(streams)
            raise
        return streams

    def _add(
        self,
        stream: RequestStream,
        prompt_token_ids: Sequence[int],
        params: SamplingParams,
        multimodal: MultimodalInputs | None,
    ) -> None:
        try:
            self.engine.add_request(
                stream.request_id,
                list(prompt_token_ids),
                params,
                on_output=stream.put,
                multimodal=multimodal,
            )
        except EngineStopped:
            self._is_stopped = True
            raise
        except Exception as exc:
            if self.metrics is not None:
                self.metrics.rejections.labels(code=type(exc).__name__).inc()
            raise

    def abort_all(self, streams: Sequence[RequestStream], *, reason: str = "abort") -> None:
        """Abort every stream that has not finished (client gone, error, stop string), counting
        each under `reason` in the finished-requests metric ("stop" for a stop string)."""
        for stream in streams:
            if not stream.is_finished:
                stream.is_finished = True
                logger.info("request %s aborted before it finished", stream.request_id)
                self.engine.abort(stream.request_id)
                if self.metrics is not None:
                    self.metrics.requests.labels(finish_reason=reason).inc()
