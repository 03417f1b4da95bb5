"""Admission, chunked prefill, decode and preemption: bookkeeping only, plain Python (no torch).

Each step gets a token budget (`max_num_batched_tokens`), spent in this order:

1. Running requests that decode (one token each), oldest first: decode latency stays bounded no
   matter how much prompt is waiting.
2. Running requests that are still prefilling, oldest first, one chunk each: the rest of their
   prompt cut to the remaining budget (and to the free KV blocks). Conv and recurrent state carry
   across chunks in the request's state slot. With `deterministic`, a chunk that leaves prompt
   behind ends on a multiple of `chunk_alignment` tokens, so the cut points of a prompt never
   depend on what else shares the step.
3. Waiting requests in arrival order (preempted ones sit at the front), while a sequence and a state
   slot are free and the first chunk's KV blocks fit. The head of the queue is never skipped, so a
   large request is not starved by small ones behind it.

Preemption: when a running request needs a KV block and none is free, the newest running request
that is not yet in this step is preempted by recompute: its blocks and its slot are freed, it goes
back to the front of the queue, and on resume its prompt plus the tokens generated so far are
prefilled again. Recompute rather than swap because a sequence's GDN state is large (147 MiB at
27B) and fixed, so swapping it costs host memory and PCIe time on every preemption, while
recomputing is one batched prefill; and the newest request has the least work to redo. Greedy
output does not change, and its already emitted tokens are kept. A request that could not fit in
the cache even alone is rejected when it is added, so every accepted request finishes.

Prefix cache (`prefix_cache`, on with `prefix_cache_snapshots`): an admitted request starts after
the longest cached prefix of its tokens (its blocks shared, the snapshot copied into its state
row). Its prefill ends a chunk, and caches its prefix, at the last checkpoint before its final
token and where it parts from a cached prefix (a prefix two prompts share), each at least
`prefix_cache_min_tokens` past the cached part before it. Cached blocks are reclaimed before any
request is preempted. Requests with media or prompt logprobs take no part.
"""

from __future__ import annotations

import logging
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace

from sparkinfer.scheduler._request_checks import request_max_len
from sparkinfer.scheduler.batch import ModelOutput, SampledToken, ScheduledBatch, ScheduledSeq
from sparkinfer.scheduler.block_manager import BlockManager
from sparkinfer.scheduler.config import SchedulerConfig
from sparkinfer.scheduler.errors import InvalidRequest
from sparkinfer.scheduler.prefix_cache import PrefixCache, PrefixEntry, media_key_tokens
from sparkinfer.scheduler.request import (
    FinishReason,
    MultimodalInputs,
    OutputCallback,
    Request,
    RequestMetrics,
    RequestOutput,
    RequestStatus,
    SamplingParams,
    TokenLogprob,
)
from sparkinfer.scheduler.speculative.policy import SpecCounters, SpecPolicy
from sparkinfer.scheduler.state_slots import StateSlots

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class SchedulerStats:
    num_running: int
    num_waiting: int
    num_kv_blocks: int
    num_used_kv_blocks: int
    num_state_slots: int
    num_used_state_slots: int
    num_steps: int
    num_prefill_tokens: int
    num_generated_tokens: int
    num_preemptions: int
    num_finished: int
    num_aborted: int
    num_failed: int
    num_prefix_cached_tokens: int = 0  # prompt tokens admitted from the prefix cache
    num_prefix_cache_entries: int = 0
    spec: SpecCounters = field(default_factory=SpecCounters)  # speculative decoding totals

    @property
    def kv_usage(self) -> float:
        return self.num_used_kv_blocks / self.num_kv_blocks

    @property
    def slot_usage(self) -> float:
        return self.num_used_state_slots / self.num_state_slots


def _call_on_output(req: Request, out: RequestOutput) -> None:
    if req.on_output is not None:
        req.on_output(out)


class Scheduler:
    """Owns the waiting queue, the running set and every `Request`'s state changes."""

    def __init__(
        self,
        config: SchedulerConfig,
        *,
        num_blocks: int,
        num_slots: int,
        vocab_size: int | None = None,
        emit: Callable[[Request, RequestOutput], None] = _call_on_output,
        snapshot_rows: Sequence[int] = (),
    ) -> None:
        """`snapshot_rows`: state-pool rows (past the `num_slots` request rows) the prefix cache
        keeps its snapshots in; none turns it off."""
        config = config.resolve_state_slots(num_slots)
        self.config = config
        self.blocks = BlockManager(num_blocks, config.block_size)
        self.slots = StateSlots(num_slots)
        self.prefix = PrefixCache(self.blocks, snapshot_rows, config.prefix_alignment)
        self._state_copies: list[tuple[int, int]] = []  # for the next step, in order
        self.spec = SpecPolicy(config)
        self._scheduled_at = 0.0  # when the step being run was scheduled (step times)
        self.max_num_seqs = config.max_seqs_per_step
        self.vocab_size = vocab_size
        self._emit = emit
        self.waiting: deque[Request] = deque()
        self.running: list[Request] = []
        self._requests: dict[str, Request] = {}
        self._step_idx = 0
        self._counters: dict[str, int] = dict.fromkeys(
            ("prefill", "cached", "generated", "preempted", "finished", "aborted", "failed"), 0
        )

    @property
    def num_waiting(self) -> int:
        return len(self.waiting)

    def has_work(self) -> bool:
        return bool(self.waiting or self.running)

    def check_request(self, prompt_token_ids: Sequence[int], params: SamplingParams) -> int:
        """Validate a request against the vocabulary, the context window and the cache; return its
        max length (raises InvalidRequest, ContextLengthExceeded or RequestTooLarge)."""
        return request_max_len(
            prompt_token_ids,
            params,
            vocab_size=self.vocab_size,
            max_model_len=self.config.max_model_len,
            # The last sampled token never enters the cache.
            max_cached_tokens=self.blocks.num_blocks * self.blocks.block_size,
        )

    def add_request(
        self,
        request_id: str,
        prompt_token_ids: Sequence[int],
        params: SamplingParams,
        *,
        on_output: OutputCallback | None = None,
        arrival_time: float | None = None,
        multimodal: MultimodalInputs | None = None,
        max_len: int | None = None,
        prefix_digests: Sequence[int] = (),
    ) -> Request:
        """Queue a request after `check_request`; ids must be unique among live requests.

        `max_len`: what `check_request` returned for this prompt and params when the caller
        already ran it (the engine does, on the client's thread): the check is one pass over the
        prompt in Python, about a millisecond per 32K tokens, that would otherwise delay the step.
        `prefix_digests`: the prompt's `prompt_digests` when the caller computed them (the engine
        does, on the thread that calls its add_request: about half a millisecond per 32K
        tokens); else the first step that looks the prompt up in the prefix cache computes them.
        """
        if request_id in self._requests:
            raise InvalidRequest(f"request_id {request_id!r} is already running: use a new id")
        if max_len is None:
            max_len = self.check_request(prompt_token_ids, params)
        req = Request(
            request_id,
            prompt_token_ids,
            params,
            max_len=max_len,
            on_output=on_output,
            arrival_time=arrival_time,
            multimodal=multimodal,
        )
        req.prefix_digests = list(prefix_digests) if multimodal is None else []  # keyed by media
        self._requests[request_id] = req
        self.waiting.append(req)
        return req

    def prompt_digests(self, prompt_token_ids: Sequence[int]) -> list[int]:
        """The prefix cache's digests of a prompt's aligned pieces ([] with the cache off). They
        depend only on the tokens and fixed settings, so another thread may compute them ahead
        of `add_request`."""
        if not self.prefix.is_enabled:
            return []
        return self.prefix.digests(prompt_token_ids, [])

    def abort(self, request_id: str) -> bool:
        """Free the request's blocks and slot and emit its final ABORT output (False: unknown)."""
        req = self._requests.get(request_id)
        if req is None:
            return False
        self._finish(req, FinishReason.ABORT)
        self._emit_final(req)
        return True

    def schedule(self) -> ScheduledBatch:
        """Pick this step's sequences and chunk sizes, allocating blocks and slots."""
        budget = self.config.max_num_batched_tokens
        num_preempted = self._counters["preempted"]
        scheduled: dict[str, ScheduledSeq] = {}
        # A request whose last token is known or in flight waits for it, then finishes.
        runnable = [r for r in self.running if not r.is_at_max_len]
        decodes = [r for r in runnable if r.num_pending_tokens == 1]
        prefills = [r for r in runnable if r.num_pending_tokens > 1]
        self.spec.plan_step(decodes)
        for i, req in enumerate(decodes + prefills):
            if budget == 0:
                break
            if req.status is not RequestStatus.RUNNING:
                continue  # preempted for an older request earlier in this loop
            num_wanted = self._chunk_len(req, budget)
            if num_wanted == 0:
                continue  # the aligned chunk does not fit in what is left of the budget
            seq = self._schedule_running(req, num_wanted, scheduled)
            if seq is not None and seq.is_decode:
                # Drafts take what the decodes after this one leave of the budget.
                seq = self._add_lookahead(seq, budget - 1 - max(0, len(decodes) - i - 1))
            if seq is not None:
                scheduled[req.request_id] = seq
                budget -= seq.num_new_tokens + seq.num_lookahead_tokens
        # After a preemption the cache is short: admitting now would only preempt again.
        has_preempted = self._counters["preempted"] > num_preempted
        while budget > 0 and self.waiting and self._can_admit() and not has_preempted:
            seq = self._admit(self.waiting[0], budget)
            if seq is None:
                break
            scheduled[seq.req.request_id] = seq
            budget -= seq.num_new_tokens
        self._step_idx += 1
        ordered = sorted(scheduled.values(), key=lambda s: not s.is_decode)
        copies, self._state_copies = tuple(self._state_copies), []
        self._scheduled_at = _now()
        return ScheduledBatch(
            step_idx=self._step_idx,
            seqs=tuple(ordered),
            state_copies=copies,
            is_read_at_once=self._is_read_at_once(ordered),
        )

    def _is_read_at_once(self, seqs: Sequence[ScheduledSeq]) -> bool:
        """Whether the step's samples must reach the host in the same call: it verifies drafts,
        or a request that samples in it may draft at its next step (the drafts and the verify's
        layout are built on the host). The drafter may ask for more (the runner's side,
        `Drafter.must_read`)."""
        if any(s.num_lookahead_tokens for s in seqs):
            return True
        # A request that samples its first token here may draft at once after it (a step of
        # prompts alone drafts nothing itself, so `is_on` is off in it): read it now, else its
        # first token waits for the next step, which could not draft either.
        if any(s.is_sampled and not s.is_decode and self.spec.may_draft(s.req) for s in seqs):
            return True
        return self.spec.is_on and any(s.is_sampled and self.spec.may_draft(s.req) for s in seqs)

    def _add_lookahead(self, seq: ScheduledSeq, budget: int) -> ScheduledSeq:
        """seq with the lookahead rows its drafts may take (from free blocks only: drafts never
        evict a cached prefix or preempt anyone)."""
        req = seq.req
        k = self.spec.num_lookahead(req, min(budget, self._num_fitting_tokens(req) - 1))
        if k == 0:
            return seq
        self._reserve(req, 1 + k)
        return replace(seq, num_lookahead_tokens=k)

    def update(self, batch: ScheduledBatch, output: ModelOutput) -> None:
        """Record the step, then the samples the host got: append, stop, free and emit.

        A sampled row of this step counts as in flight until its sample arrives (in this
        output, or in the next one when the runner overlaps steps).
        """
        self._record_step_time(batch, output)
        for seq in batch.seqs:
            req = seq.req
            if req.is_finished:
                continue
            req.num_computed_tokens = seq.num_cached_tokens + seq.num_new_tokens
            if seq.num_lookahead_tokens:
                self._record_verify(seq, output)
            if req.checkpoints and req.num_computed_tokens == req.checkpoints[0]:
                self._checkpoint(req)
            if not seq.is_decode:
                self._counters["prefill"] += seq.num_new_tokens
            if req.request_id in output.prompt_logprobs:
                # Entry i scores prompt token i + 1; a recomputed prompt overwrites its own.
                del req.prompt_logprobs[seq.num_cached_tokens :]
                req.prompt_logprobs.extend(output.prompt_logprobs[req.request_id])
            if seq.is_sampled:
                req.num_inflight_tokens += 1
        for seq, sample in output.samples:
            self._append(seq.req, sample)

    def _record_verify(self, seq: ScheduledSeq, output: ModelOutput) -> None:
        """Keep the accepted drafts' KV and free the blocks past them; their samples (one more
        than the accepted drafts) are in this output."""
        req = seq.req
        outcome = output.spec.get(req.request_id)
        if outcome is not None:
            req.num_computed_tokens += outcome.num_accepted
            req.num_inflight_tokens += outcome.num_accepted
            self.spec.record(req, outcome)
        else:
            self.spec.record_no_drafts(req)
        keep = self.blocks.blocks_for(req.num_computed_tokens)
        self.blocks.free(req.block_ids[keep:])
        del req.block_ids[keep:]

    def _record_step_time(self, batch: ScheduledBatch, output: ModelOutput) -> None:
        """Feed the cost model a decode-only step's time (prompt chunks would blur it)."""
        if not self.config.is_speculative or not batch.seqs:
            return
        if not all(s.is_decode for s in batch.seqs):
            return
        num_rows = len(batch.seqs) + sum(o.num_drafts for o in output.spec.values())
        seconds = _now() - self._scheduled_at
        self.spec.record_step(num_rows=num_rows, is_verify=bool(output.spec), seconds=seconds)

    def _append(self, req: Request, sample: SampledToken) -> None:
        req.num_inflight_tokens -= 1
        if req.is_finished:  # ended (stop, abort) while this sample was in flight
            return
        req.token_ids.append(sample.token_id)
        self._counters["generated"] += 1
        if req.first_token_time is None:
            req.first_token_time = _now()
        reason = self._stop_reason(req, sample.token_id)
        if reason is not None:
            self._finish(req, reason)
        prompt_logprobs, req.prompt_logprobs = tuple(req.prompt_logprobs), []
        self._emit(req, self._output(req, (sample.token_id,), sample.logprob, prompt_logprobs))

    def fail(self, batch: ScheduledBatch, error: BaseException) -> None:
        """End every request of a failed step with ERROR, and those whose samples were still in
        flight (a failed runner drops them); the state they left behind is lost."""
        message = f"engine step failed: {type(error).__name__}: {error}"
        inflight = [r for r in (*self.running, *self.waiting) if r.num_inflight_tokens]
        for req in (*(s.req for s in batch.seqs), *inflight):
            if not req.is_finished:
                self.fail_request(req, message)

    def fail_request(self, req: Request, message: str) -> None:
        """End one live request with ERROR and `message`, freeing what it holds."""
        self._finish(req, FinishReason.ERROR, error=message)
        self._emit_final(req)

    def stats(self) -> SchedulerStats:
        c = self._counters
        return SchedulerStats(
            num_running=len(self.running),
            num_waiting=len(self.waiting),
            num_kv_blocks=self.blocks.num_blocks,
            num_used_kv_blocks=self.blocks.num_used_blocks,
            num_state_slots=self.slots.num_slots,
            num_used_state_slots=self.slots.num_used_slots,
            num_steps=self._step_idx,
            num_prefill_tokens=c["prefill"],
            num_generated_tokens=c["generated"],
            num_preemptions=c["preempted"],
            num_finished=c["finished"],
            num_aborted=c["aborted"],
            num_failed=c["failed"],
            num_prefix_cached_tokens=c["cached"],
            num_prefix_cache_entries=len(self.prefix),
            spec=replace(
                self.spec.counters,
                accepted_per_position=list(self.spec.counters.accepted_per_position),
            ),
        )

    def _schedule_running(
        self, req: Request, num_wanted: int, scheduled: dict[str, ScheduledSeq]
    ) -> ScheduledSeq | None:
        """Fit `req`'s next chunk, preempting the newest unscheduled requests for blocks."""
        # Cached prefixes go first: `_reclaim` evicts until the chunk fits or none is left.
        total = req.num_computed_tokens + num_wanted
        self._reclaim(self.blocks.blocks_for(total) - len(req.block_ids))
        while True:
            num_new = self._chunk_len(req, min(num_wanted, self._num_fitting_tokens(req)))
            # A prefill chunk may shrink to the free blocks; a decode needs its one token.
            if num_new > 0:
                return self._reserve(req, num_new)
            victim = next(r for r in reversed(self.running) if r.request_id not in scheduled)
            self._preempt(victim)
            if victim is req:
                return None

    def _can_admit(self) -> bool:
        return len(self.running) < self.max_num_seqs and self.slots.num_free_slots > 0

    def _admit(self, req: Request, budget: int) -> ScheduledSeq | None:
        # A request preempted with a sample in flight waits until that token is known.
        if req.num_inflight_tokens:
            return None
        hit = self._lookup(req)
        num_cached = len(hit.tokens) if hit is not None else 0
        req.num_computed_tokens = num_cached
        req.checkpoints = self._checkpoints_for(req, num_cached)
        num_new = self._chunk_len(req, budget)
        num_shared = len(hit.blocks) if hit is not None else 0
        num_needed = self.blocks.blocks_for(num_cached + num_new) - num_shared
        if num_new > 0:
            self._reclaim(num_needed, keep=hit)
        if num_new == 0 or not self.blocks.can_allocate(num_needed):
            req.num_computed_tokens, req.checkpoints = 0, []
            return None
        self.waiting.popleft()
        req.status = RequestStatus.RUNNING
        req.state_slot = self.slots.allocate()
        req.num_cached_prompt_tokens = min(num_cached, req.num_prompt_tokens)
        if hit is not None:
            req.block_ids = list(hit.blocks)
            self.blocks.share(req.block_ids)
            self._state_copies.append((hit.snapshot_row, req.state_slot))
            self._counters["cached"] += num_cached
        self.running.append(req)
        return self._reserve(req, num_new)

    def _takes_part_in_prefix_cache(self, req: Request) -> bool:
        """Media take part when they carry content hashes (their pads share token ids); a hit
        skips the rows prompt logprobs need."""
        mm = req.multimodal
        return (
            self.prefix.is_enabled
            and (mm is None or bool(mm.content_hashes))
            and req.params.prompt_logprobs is None
        )

    def _prefix_tokens(self, req: Request) -> list[int]:
        """What the prefix cache keys `req` by: its tokens, each media pad run as its hash."""
        mm = req.multimodal
        if mm is None:
            return req.token_ids
        return media_key_tokens(req.token_ids, mm.content_hashes, mm.pad_runs)

    def _lookup(self, req: Request) -> PrefixEntry | None:
        if not self._takes_part_in_prefix_cache(req):
            return None
        tokens = self._prefix_tokens(req)
        digests = self.prefix.digests(tokens, req.prefix_digests)
        hit = self.prefix.lookup(tokens, digests, req.prefix_confirmed)
        req.prefix_confirmed = hit
        return hit

    def _checkpoints_for(self, req: Request, num_cached: int) -> list[int]:
        """Where `req`'s prefill is to end chunks and cache its prefix, each at least
        `prefix_cache_min_tokens` past the part before it: where it parts from a cached prefix
        (a prefix two prompts share, which a third may share too), and its last checkpoint
        before its final token."""
        if not self._takes_part_in_prefix_cache(req):
            return []
        align, min_tokens = self.prefix.alignment, self.config.prefix_cache_min_tokens
        end = (req.num_tokens - 1) // align * align
        points: list[int] = []
        digests = req.prefix_digests  # computed by _lookup
        for point in (self.prefix.longest_shared(digests, end), end):
            far_enough = point - max([num_cached, *points]) >= min_tokens
            if far_enough and not self.prefix.contains(digests, point):
                points.append(point)
        return points

    def _checkpoint(self, req: Request) -> None:
        """Cache `req`'s prefix up to its next checkpoint, which the step just computed; the next
        step copies its state row to the entry's snapshot row before anything writes it."""
        end = req.checkpoints.pop(0)
        assert req.state_slot is not None
        tokens = self._prefix_tokens(req)[:end]
        entry = self.prefix.insert(tokens, req.prefix_digests, req.block_ids)
        if entry is not None:
            self._state_copies.append((req.state_slot, entry.snapshot_row))

    def _reclaim(self, num_blocks: int, keep: PrefixEntry | None = None) -> None:
        """Evict cached prefixes (least recently used first, never `keep`) until `num_blocks`
        blocks are free or none is left to evict."""
        while not self.blocks.can_allocate(num_blocks) and self.prefix.evict_one(keep):
            pass

    def _chunk_len(self, req: Request, limit: int) -> int:
        """Tokens of `req` to run now, at most `limit`: all that is pending, or a chunk ending on
        a multiple of `chunk_alignment` (0 when no such end fits), never past its checkpoint."""
        start = req.num_computed_tokens
        if req.checkpoints:
            limit = min(limit, req.checkpoints[0] - start)
        pending = req.num_pending_tokens
        if pending <= limit:
            return pending
        align = self.config.chunk_alignment
        return max(0, (start + max(0, limit)) // align * align - start)

    def _num_fitting_tokens(self, req: Request) -> int:
        held = (len(req.block_ids) + self.blocks.num_free_blocks) * self.blocks.block_size
        return held - req.num_computed_tokens

    def _reserve(self, req: Request, num_new: int) -> ScheduledSeq:
        total = req.num_computed_tokens + num_new
        missing = self.blocks.blocks_for(total) - len(req.block_ids)
        if missing > 0:
            req.block_ids.extend(self.blocks.allocate(missing))
        return ScheduledSeq(req, req.num_computed_tokens, num_new)

    def _preempt(self, req: Request) -> None:
        self.running.remove(req)
        self._release(req)
        req.status = RequestStatus.WAITING
        req.num_computed_tokens, req.checkpoints = 0, []
        req.num_preemptions += 1
        self._counters["preempted"] += 1
        self.waiting.appendleft(req)

    def _release(self, req: Request) -> None:
        self.blocks.free(req.block_ids)
        req.block_ids = []
        if req.state_slot is not None:
            self.slots.free(req.state_slot)
            req.state_slot = None

    def _stop_reason(self, req: Request, token_id: int) -> FinishReason | None:
        params = req.params
        if req.num_output_tokens >= params.min_tokens:
            if token_id in params.stop_token_ids:
                return FinishReason.STOP
            if not params.ignore_eos and token_id in self.config.eos_token_ids:
                return FinishReason.STOP
        if req.num_tokens >= req.max_len:
            return FinishReason.LENGTH
        return None

    def _finish(self, req: Request, reason: FinishReason, *, error: str | None = None) -> None:
        if req.status is RequestStatus.RUNNING:
            self.running.remove(req)
        elif req.status is RequestStatus.WAITING:  # queued, or preempted with a sample in flight
            self.waiting.remove(req)
        self._release(req)
        req.status = RequestStatus.FINISHED
        req.finish_reason = reason
        req.error = error
        req.finish_time = _now()
        del self._requests[req.request_id]
        key = {FinishReason.ABORT: "aborted", FinishReason.ERROR: "failed"}.get(reason, "finished")
        self._counters[key] += 1
        spec = req.spec
        if spec.num_verifies:
            logger.info(
                "request %s: %d of %d draft tokens accepted in %d verifies (%.2f tokens a verify)",
                req.request_id, spec.num_accepted_tokens, spec.num_draft_tokens,
                spec.num_verifies, 1 + spec.num_accepted_tokens / spec.num_verifies,
            )  # fmt: skip

    def _emit_final(self, req: Request) -> None:
        self._emit(req, self._output(req, (), None))

    def _output(
        self,
        req: Request,
        new_token_ids: tuple[int, ...],
        logprob: TokenLogprob | None,
        prompt_logprobs: tuple[TokenLogprob, ...] = (),
    ) -> RequestOutput:
        return RequestOutput(
            request_id=req.request_id,
            new_token_ids=new_token_ids,
            num_prompt_tokens=req.num_prompt_tokens,
            num_output_tokens=req.num_output_tokens,
            num_cached_tokens=req.num_cached_prompt_tokens,
            finish_reason=req.finish_reason,
            error=req.error,
            logprobs=() if logprob is None else (logprob,),
            prompt_logprobs=prompt_logprobs,
            metrics=req.metrics() if req.is_finished else _NO_METRICS,
        )


_NO_METRICS = RequestMetrics()


def _now() -> float:
    return time.monotonic()
