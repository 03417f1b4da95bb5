"""The engine: a background thread that takes requests, schedules, runs the model and emits."""

from __future__ import annotations

import itertools
import logging
import math
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

import torch
from sparkinfer.model.drafters.dflash import BlockDrafter
from sparkinfer.scheduler._causal_lm import CausalLM
from sparkinfer.scheduler.batch import ModelOutput, ScheduledBatch
from sparkinfer.scheduler.config import SchedulerConfig
from sparkinfer.scheduler.errors import EngineStopped, InvalidRequest, QueueFull
from sparkinfer.scheduler.observer import StepObserver
from sparkinfer.scheduler.request import (
    FinishReason,
    MultimodalInputs,
    OutputCallback,
    Request,
    RequestOutput,
    SamplingParams,
)
from sparkinfer.scheduler.runner import Runner
from sparkinfer.scheduler.scheduler import Scheduler, SchedulerStats

logger = logging.getLogger(__name__)


class StepRunner(Protocol):
    """What the engine needs from a runner: cache sizes and one step's forward + sampling."""

    @property
    def num_blocks(self) -> int: ...
    @property
    def num_slots(self) -> int: ...
    @property
    def vocab_size(self) -> int | None: ...
    @property
    def snapshot_rows(self) -> Sequence[int]: ...
    def check_multimodal(self, prompt_token_ids: Sequence[int], mm: MultimodalInputs) -> None: ...
    def run(self, batch: ScheduledBatch) -> ModelOutput: ...
    def close(self) -> None: ...


@dataclass(frozen=True)
class EngineLimits:
    """What a client of the engine may rely on: the bounds it admits requests under."""

    max_model_len: int  # prompt + output tokens of one request
    max_seqs_per_step: int  # sequences one step holds (max_num_seqs, bounded by the state slots)
    max_queue_depth: int  # requests waiting before add_request raises QueueFull; 0: unlimited

    @classmethod
    def of(cls, config: SchedulerConfig) -> EngineLimits:
        return cls(config.max_model_len, config.max_seqs_per_step, config.max_queue_depth)


@dataclass(frozen=True)
class _Add:
    request_id: str
    prompt_token_ids: list[int]
    params: SamplingParams
    on_output: OutputCallback | None
    arrival_time: float
    max_len: int  # check_request's answer: the cache never shrinks, so it holds at admission
    multimodal: MultimodalInputs | None = None
    prefix_digests: tuple[int, ...] = ()  # the scheduler's prompt_digests, computed ahead


@dataclass(frozen=True)
class _Abort:
    request_id: str


class Engine:
    """Runs the loop in its own thread; `add_request`, `abort`, `stats`, `shutdown` are thread-safe.

    `on_output` is called from the engine thread after every step that produced tokens for the
    request, and exactly once with a finish reason. A failing step ends only the requests in it
    (FinishReason.ERROR); a callback that raises gets its request aborted.
    """

    def __init__(self, runner: StepRunner, config: SchedulerConfig) -> None:
        self.config = config
        self.runner = runner
        self.limits = EngineLimits.of(config)
        self.scheduler = Scheduler(
            config,
            num_blocks=runner.num_blocks,
            num_slots=runner.num_slots,
            vocab_size=runner.vocab_size,
            emit=self._emit,
            snapshot_rows=runner.snapshot_rows,
        )
        self._cond = threading.Condition()
        self._inbox: list[_Add | _Abort] = []
        self._live_ids: set[str] = set()
        self._is_stopping = False
        self._mean_request_s = 1.0  # moving average of finished requests' time in the engine
        self._ids = itertools.count()
        self._thread = threading.Thread(target=self._run_loop, name="sparkinfer-engine")
        self._thread.start()

    @classmethod
    def from_model(
        cls,
        model: CausalLM,
        config: SchedulerConfig,
        *,
        device: torch.device | str | None = None,
        drafter: BlockDrafter | None = None,
        observer: StepObserver | None = None,
    ) -> Engine:
        """Build the runner for `model` (caches sized from memory, graphs captured), then start
        with the runner's config ("auto" speculation made concrete for this model). `drafter`:
        a loaded block drafter (`--draft-model`), which "auto" and "draft_model" draft with.
        `observer`: brackets the steps' decode-graph replays and drafter calls (profilers and
        benchmarks time them through it; `observer.py`); None, the default, costs nothing."""
        runner = Runner(model, config, device=device, drafter=drafter, observer=observer)
        return cls(runner, runner.config)

    def add_request(
        self,
        request_id: str,
        prompt_token_ids: Sequence[int],
        params: SamplingParams,
        *,
        on_output: OutputCallback | None,
        multimodal: MultimodalInputs | None = None,
    ) -> None:
        """Queue a request; raises on bad input, a full queue or a stopped engine.

        `multimodal`: the prompt's images and videos (pixels, grids, MRoPE positions); the prompt
        then holds their expanded pad tokens.
        """
        prompt = list(prompt_token_ids)
        max_len = self.scheduler.check_request(prompt, params)
        digests: tuple[int, ...] = ()
        if multimodal is not None:
            self.runner.check_multimodal(prompt, multimodal)
        else:  # on this thread, not the engine's: about half a millisecond per 32K tokens
            digests = tuple(self.scheduler.prompt_digests(prompt))
        with self._cond:
            if self._is_stopping:
                raise EngineStopped("the engine is shut down: start a new one")
            if request_id in self._live_ids:
                raise InvalidRequest(f"request_id {request_id!r} is already in use: use a new id")
            self._check_queue_depth()
            self._live_ids.add(request_id)
            add = _Add(request_id, prompt, params, on_output, time.monotonic(), max_len,
                       multimodal, digests)  # fmt: skip
            self._inbox.append(add)
            self._cond.notify()

    def abort(self, request_id: str) -> None:
        """Free the request's blocks and slot at the next step; it ends with FinishReason.ABORT."""
        with self._cond:
            self._inbox.append(_Abort(request_id))
            self._cond.notify()

    def generate(
        self, prompt_token_ids: Sequence[int], params: SamplingParams, *, timeout: float = 600.0
    ) -> list[int]:
        """Run one request to the end and return its tokens (for tests and benchmarks).

        Raises TimeoutError (the request is aborted), EngineStopped when the engine shut down
        before the request finished, and RuntimeError when the engine failed it.
        """
        done = threading.Event()
        tokens: list[int] = []
        finals: list[RequestOutput] = []

        def on_output(out: RequestOutput) -> None:
            tokens.extend(out.new_token_ids)
            if out.is_finished:
                finals.append(out)
                done.set()

        request_id = f"generate-{next(self._ids)}"
        self.add_request(request_id, prompt_token_ids, params, on_output=on_output)
        if not done.wait(timeout):
            self.abort(request_id)
            raise TimeoutError(f"request {request_id} took over {timeout} s: raise timeout")
        final = finals[0]
        if final.finish_reason is FinishReason.ERROR:
            raise RuntimeError(final.error)
        if final.finish_reason is FinishReason.ABORT:  # cut short: never pass it off as complete
            raise EngineStopped(
                f"request {request_id} was aborted after {final.num_output_tokens} tokens: "
                "the engine shut down; start a new one"
            )
        return tokens

    def stats(self) -> SchedulerStats:
        return self.scheduler.stats()

    def shutdown(self, timeout: float | None = 60.0) -> None:
        """Stop the loop after the current step; unfinished requests end with ABORT, and the
        loop frees the runner's graphs and caches as it ends (an engine started next in this
        process sizes its caches from that memory)."""
        with self._cond:
            self._is_stopping = True
            self._cond.notify()
        if threading.current_thread() is not self._thread:
            self._thread.join(timeout)

    def has_work(self) -> bool:
        return self.scheduler.has_work()

    def is_alive(self) -> bool:
        """True while the loop runs and takes requests; False once shut down or died."""
        with self._cond:
            return self._thread.is_alive() and not self._is_stopping

    def _run_loop(self) -> None:
        try:
            while self._take_inbox():  # new requests and aborts; blocks while idle
                batch = self.scheduler.schedule()  # admit, chunk, preempt: bookkeeping only
                try:
                    output = self.runner.run(batch)
                    self.scheduler.update(batch, output)  # append, stop, free, emit
                except Exception as exc:  # a failed step ends only its own requests
                    logger.exception("engine step %d failed", batch.step_idx)
                    self.scheduler.fail(batch, exc)
        except BaseException:
            logger.exception("the engine loop died; every live request ends with an error")
            self._end_all(FinishReason.ERROR)
            raise
        self._end_all(FinishReason.ABORT)

    def _take_inbox(self) -> bool:
        """Apply queued adds and aborts, waiting while there is nothing to do. False: stop."""
        while True:
            with self._cond:
                while not (self._inbox or self._is_stopping or self.has_work()):
                    self._cond.wait()
                if self._is_stopping:
                    return False
                inbox, self._inbox = self._inbox, []
            for item in inbox:
                self._apply(item)
            if self.has_work():
                return True

    def _apply(self, item: _Add | _Abort) -> None:
        if isinstance(item, _Abort):
            self.scheduler.abort(item.request_id)
            return
        try:
            self.scheduler.add_request(
                item.request_id,
                item.prompt_token_ids,
                item.params,
                on_output=item.on_output,
                arrival_time=item.arrival_time,
                multimodal=item.multimodal,
                max_len=item.max_len,
                prefix_digests=item.prefix_digests,
            )
        except ValueError as exc:  # add_request checked it already; the cache cannot shrink
            self._emit_rejection(item, FinishReason.ERROR, str(exc))

    def _check_queue_depth(self) -> None:
        depth = self.config.max_queue_depth
        num_queued = self.scheduler.num_waiting + sum(isinstance(i, _Add) for i in self._inbox)
        # Only what waits for a seat counts: requests that free seats will take are not queued.
        num_free = max(0, self.scheduler.max_num_seqs - len(self.scheduler.running))
        if depth and num_queued - num_free >= depth:
            rounds = math.ceil((num_queued + 1) / self.scheduler.max_num_seqs)
            retry_after_s = min(60.0, max(1.0, rounds * self._mean_request_s))
            raise QueueFull(
                f"{num_queued - num_free} requests wait for a seat; max_queue_depth is {depth}: "
                f"retry in {retry_after_s:.0f} s or raise max_queue_depth",
                retry_after_s=retry_after_s,
            )

    def _emit(self, req: Request, out: RequestOutput) -> None:
        if out.is_finished:
            with self._cond:
                self._live_ids.discard(req.request_id)
                if req.finish_time is not None:
                    spent = req.finish_time - req.arrival_time
                    self._mean_request_s = 0.9 * self._mean_request_s + 0.1 * spent
        if req.on_output is None:
            return
        try:
            req.on_output(out)
        except BaseException:  # a client's error (asyncio.CancelledError too) never stops the loop
            logger.exception("on_output of request %s raised; aborting it", req.request_id)
            if not out.is_finished:
                with self._cond:
                    self._inbox.append(_Abort(req.request_id))

    def _emit_rejection(self, item: _Add, reason: FinishReason, error: str | None) -> None:
        """End a request that never reached the scheduler."""
        with self._cond:
            self._live_ids.discard(item.request_id)
        if item.on_output is None:
            return
        out = RequestOutput(
            request_id=item.request_id,
            new_token_ids=(),
            num_prompt_tokens=len(item.prompt_token_ids),
            num_output_tokens=0,
            finish_reason=reason,
            error=error,
        )
        try:
            item.on_output(out)
        except BaseException:  # as in _emit: the client's problem, not the loop's
            logger.exception("on_output of request %s raised", item.request_id)

    def _end_all(self, reason: FinishReason) -> None:
        """End every live request (shutdown or a dead loop) so that nobody waits forever."""
        with self._cond:
            self._is_stopping = True
            inbox, self._inbox = self._inbox, []
        for item in inbox:
            if isinstance(item, _Add):
                error = None if reason is FinishReason.ABORT else "the engine loop died"
                self._emit_rejection(item, reason, error)
        for req in [*self.scheduler.running, *self.scheduler.waiting]:
            if reason is FinishReason.ABORT:
                self.scheduler.abort(req.request_id)
            else:
                self.scheduler.fail_request(req, "the engine loop died")
        self.runner.close()
