"""Speculation's phases of an engine step, behind `Runner.run`: draft, the verify forward, the
draws, acceptance and the commit of the kept positions' states, and what the drafter learns
(`speculative.verify`).

The runner hands a step here when its samples must reach the host within the step: the scheduler
gave a decode row lookahead rows (or a request that samples in it may draft next), or the
drafter says it must see the step's results before the next (`Drafter.must_read`: MTP when
steps do not overlap). The step before is read first (a drafter
drafts from every token); the prompt chunks run as in any step; the decode rows run as one
verify forward when any of them has drafts (replaying a `graphs.verify` graph when a bucket
holds the rows), else as a plain decode forward (the decode graphs then still apply). With a
drafter that reads hidden states (MTP) a plain decode forward replays a decode graph too (each
graph keeps its rows' hidden states, `DecodeGraphs.hidden`); with a block drafter (`needs_taps`)
the runner captured its decode and verify graphs tapped, so they keep the tap layers' rows too
(`tapped`); prompt chunks, and decode rows no bucket holds, run eagerly over every row. Steps
that overlap the next stay with the runner; the drafter still gets their rows on the device
(`observe_in_flight`; a step with prompt chunks: `observe_prompts_in_flight`, every prompt row
from an eager forward, the sampled rows' next tokens still in flight).

Within the step the host waits for the device once: drafts left on the device
(`Drafter.propose_drafts`, `Drafts`) feed the verify's input ids there, acceptance runs on the
device too so the commit is queued right behind the sampler (`num_kept_on_device`), and only
then does the host read the draws (and the drafts' copy, queued behind them).

The step drives the runner through its public face only (`speculative.target.Target`). Each
call of the drafter's `propose` and `observe` is a span of the runner's `StepObserver`, when it
has one (`_drafter_span`).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager

import torch
from sparkinfer.model.cache_spec import ModelCaches
from sparkinfer.model.drafters.dflash import BlockDrafter
from sparkinfer.model.forward_batch import host_to_device
from sparkinfer.scheduler._causal_lm import CausalLM, forward_tapped
from sparkinfer.scheduler._inflight import StepInFlight, merge_inflight_inputs
from sparkinfer.scheduler.batch import ModelOutput, SampledToken, ScheduledBatch, ScheduledSeq
from sparkinfer.scheduler.config import SchedulerConfig, SpeculativeMethod
from sparkinfer.scheduler.errors import GraphCaptureError
from sparkinfer.scheduler.observer import StepObserver, StepSpan, observed
from sparkinfer.scheduler.request import Request, TokenLogprob
from sparkinfer.scheduler.sampler import DrawnTokens, Sampler
from sparkinfer.scheduler.speculative.block_drafter import DraftModelDrafter
from sparkinfer.scheduler.speculative.drafter import Drafter, Drafts, TargetStep
from sparkinfer.scheduler.speculative.mtp_drafter import MAX_PENDING_ROWS, MTPDrafter
from sparkinfer.scheduler.speculative.ngram_drafter import NgramDrafter
from sparkinfer.scheduler.speculative.target import Target
from sparkinfer.scheduler.speculative.verify import (
    Accepted,
    VerifyRows,
    accept,
    layout_verify,
    num_kept_on_device,
    verify_batch,
    verify_input_ids,
)

logger = logging.getLogger(__name__)


class StepDraws:
    """A step's draws on the device and their copy to the host, queued at once (read: `read`)."""

    def __init__(self, drawn: DrawnTokens) -> None:
        self.token_ids = drawn.token_ids  # [rows] int64 on the device
        self._host = drawn.to_host(non_blocking=True)
        self._copied: torch.cuda.Event | None = None
        if drawn.token_ids.is_cuda:
            self._copied = torch.cuda.Event()
            self._copied.record()

    def read(self) -> list[SampledToken]:
        """The draws on the host (waits for their copy, not for what was queued after it)."""
        if self._copied is not None:
            self._copied.synchronize()
        return self._host.samples()


def describe_speculation(asked: SpeculativeMethod, config: SchedulerConfig) -> str:
    """One line for the start-up log: what was asked, which drafter runs, and how deep."""
    k = config.num_speculative_tokens
    if config.speculative == "draft_model":
        chosen = f"the block drafter of --draft-model drafts up to {k} tokens a request and step"
    elif config.speculative == "mtp":
        chosen = f"the checkpoint's MTP head drafts up to {k} tokens a request and step"
    elif config.speculative == "ngram":
        chosen = f"prompt lookup drafts up to {k} tokens a request and step"
    elif asked == "auto":
        chosen = "plain decoding (the checkpoint has no MTP head)"
    else:
        chosen = "plain decoding"
    return f"speculative {asked}: {chosen}"


def make_drafter(
    config: SchedulerConfig,
    model: CausalLM,
    caches: ModelCaches,
    device: torch.device,
    *,
    draft_model: BlockDrafter | None = None,
    num_blocks: int = 0,
) -> Drafter | None:
    """The drafter `config.speculative` names (None: off); draft_model: the loaded block
    drafter, whose cache pages share the target's `num_blocks` block ids."""
    if config.speculative == "ngram":
        return NgramDrafter()
    if config.speculative == "draft_model":
        if draft_model is None:
            raise ValueError(
                "speculative is 'draft_model' but no block drafter is loaded: pass --draft-model "
                "DIR|HUB_ID (Engine.from_model(..., drafter=...)) or use speculative 'mtp'"
            )
        return DraftModelDrafter(
            draft_model,
            num_blocks=num_blocks,
            block_size=config.block_size,
            max_seqs=config.max_num_seqs,
            device=device,
        )
    if config.speculative != "mtp":
        return None
    head = getattr(model, "mtp", None)
    if head is None:
        raise ValueError(
            "speculative is 'mtp' but the model has no MTP head: load the checkpoint with its "
            "mtp.* tensors (load_model(..., use_mtp=True)) or use speculative 'ngram'"
        )
    return MTPDrafter(
        model,
        head,
        caches,
        block_size=config.block_size,
        device=device,
        draft_vocab=config.speculative_draft_vocab,
    )


class SpeculativeStep:
    """Runs a runner's steps read at once; owns its drafter."""

    def __init__(
        self, target: Target, drafter: Drafter | None, *, observer: StepObserver | None = None
    ) -> None:
        self.target = target
        self.drafter = drafter
        self.observer = observer  # brackets each drafter call (development tools)

    def capture_graphs(self) -> None:
        """Capture the MTP head's graphs for the verify graphs' buckets; when that fails the
        head runs eagerly (slower drafts, the same tokens). A block drafter's proposals are
        graphed per decode graph bucket, captured now where its attention is paged, else per
        (decode graph bucket, keys bucket), each captured when first needed."""
        t, verify = self.target, self.target.verify_graphs
        if isinstance(self.drafter, DraftModelDrafter) and t.graphs is not None:
            # its buffers, zeroed on the stream that reads them; its graphs, under the numerics
            # of the steps that replay them
            with t.on_stream(), t.numerics(is_decode=True):
                self.drafter.use_graphs(
                    row_sizes=t.graphs.batch_sizes,
                    max_context=t.config.max_model_len,
                    stream=t.graphs.stream,
                )
        if not isinstance(self.drafter, MTPDrafter) or verify is None:
            return
        try:
            with t.on_stream(), t.numerics(is_decode=True):
                self.drafter.capture_graphs(
                    batch_sizes=verify.batch_sizes,
                    num_drafts=verify.num_drafts,
                    max_blocks_per_seq=t.config.max_blocks_per_seq,
                    stream=verify.stream,
                )
        except (GraphCaptureError, RuntimeError, ValueError, AssertionError):
            # Its warm-up runs outside capture too: any failure leaves the eager head, which
            # drafts the same tokens.
            self.drafter.graphs = None
            logger.warning("capturing the MTP head's graphs failed: it runs eagerly", exc_info=True)

    def warm_up(self) -> None:
        """Build the kernel variants a verify step reaches outside its graphs, under the decode
        numerics: the lm_head at every verify row count (1 to the caches' verify rows: it runs
        after the replay, on the rows that count), the MTP head at every catch-up row
        count of one request (1 to MAX_PENDING_ROWS + k + 1) and at the longer catch-ups of
        many (`_warm_up_long_catch_ups`), and the drafts' logits at every eager draft row
        count. Else each would be built while serving, in a request's step."""
        t, cfg = self.target, self.target.config
        k = cfg.num_speculative_tokens
        max_rows = cfg.num_verify_rows
        with torch.inference_mode(), t.on_stream(), t.numerics(is_decode=True):
            ids = torch.zeros(max_rows, dtype=torch.int64, device=t.device)
            hidden = t.model.embed_input_ids(ids)
            for num_rows in range(1, max_rows + 1):
                t.model.compute_logits(hidden[:num_rows])
            if isinstance(self.drafter, MTPDrafter):
                self.drafter.warm_up(range(1, MAX_PENDING_ROWS + k + 2))
                for num_rows in range(1, cfg.max_seqs_per_step + 1):
                    self.drafter.draft_logits(hidden[:num_rows])
        if isinstance(self.drafter, MTPDrafter):
            self._warm_up_long_catch_ups(self.drafter)

    def _warm_up_long_catch_ups(self, drafter: MTPDrafter) -> None:
        """One catch-up runs the head over every due request's pending rows at once (each up
        to MAX_PENDING_ROWS + k + 1, beside a step's prompt chunks), which can be more rows than
        the longest prompt chunk the runner's start-up ran; the attention picks its kernel
        variant by a step's rows (`kernel_warmup_lengths`). Run the head once at the shortest
        length of each variant past that chunk, under both numerics (a step with prompt chunks
        runs the head under the prefill ones), where the caches hold the rows."""
        t, cfg = self.target, self.target.config
        warmed = min(cfg.max_num_batched_tokens, cfg.max_model_len)  # the runner's prompt chunks
        rows_per_seq = MAX_PENDING_ROWS + cfg.num_speculative_tokens + 1
        longest = cfg.max_num_batched_tokens + cfg.max_seqs_per_step * rows_per_seq
        num_blocks = next(iter(t.caches.attention.values())).k.shape[0]
        fits = (num_blocks - 1) * cfg.block_size  # the warm-up's rows follow a block of context
        for is_decode in (True, False):
            with torch.inference_mode(), t.on_stream(), t.numerics(is_decode=is_decode):
                lengths = t.model.kernel_warmup_lengths(longest)
                drafter.warm_up(n for n in lengths if warmed < n <= fits)

    def drop_graphs(self) -> None:
        if isinstance(self.drafter, MTPDrafter):
            self.drafter.graphs = None

    @property
    def needs_hidden(self) -> bool:
        return self.drafter is not None and self.drafter.needs_hidden

    @property
    def needs_taps(self) -> bool:
        """Whether the drafter reads the target's tap layers (a block drafter): the target's
        forwards then run tapped, its decode and verify graphs too (captured `use_taps`)."""
        # getattr: a wrapping or stand-in drafter (tests, benchmarks) may not declare it
        return self.drafter is not None and bool(getattr(self.drafter, "needs_taps", False))

    def must_read(self, batch: ScheduledBatch) -> bool:
        """Whether the drafter has to see this step's results before the next step runs."""
        is_overlapped = self.target.config.overlap_steps
        return self.drafter is not None and self.drafter.must_read(
            batch, is_overlapped=is_overlapped
        )

    def run(self, batch: ScheduledBatch, inflight: StepInFlight | None) -> ModelOutput:
        """This step's samples (after the step before's), each verify's outcome."""
        t = self.target
        before = inflight.resolve() if inflight is not None else []
        known = {seq.req: sample.token_id for seq, sample in before}
        prompt_logprobs: dict[str, tuple[TokenLogprob, ...]] = {}
        decodes = [s for s in batch.seqs if s.is_decode]
        prefills = [s for s in batch.seqs if not s.is_decode]
        with t.on_stream():
            t.prepare_step(batch)
            wanted = [s.num_lookahead_tokens for s in decodes]
            drafts = Drafts.on_host([[] for _ in decodes])
            if self.drafter is not None and any(wanted):
                # The target's decode numerics: the kernels its graphs already built, so no
                # head shape compiles a kernel of its own mid-serving.
                with t.numerics(is_decode=True), self._drafter_span("draft_propose"):
                    drafts = self._propose(self.drafter, decodes, wanted)
            logits: list[torch.Tensor] = []
            hidden: list[torch.Tensor] = []
            rows, commit = layout_verify(decodes, drafts.counts), None
            if decodes:
                with t.numerics(is_decode=True):
                    rows, commit = self._decode_rows(decodes, drafts, logits, hidden, inflight)
            sampled = [s for s in prefills if s.is_sampled]
            if prefills:
                with t.numerics(is_decode=False):
                    self._plain(prefills, logits, hidden, inflight, prompt_logprobs)
            draws = self._draw(rows, drafts, decodes, sampled, logits, inflight, known)
            if commit is not None and draws is not None:
                # The verify left the GDN states: keep the accepted rows', acceptance run on
                # the device, so the commit is queued before the host waits for the draws.
                with t.numerics(is_decode=True):  # the decode steps' arithmetic
                    commit(draws.token_ids)
            drawn = [] if draws is None else draws.read()
            num_verify = len(rows.row_seqs)
            # Drafts left on the device: their copy was queued behind them, done by now.
            drafts_of = {id(s): d for s, d in zip(decodes, drafts.host(), strict=True)}
            accepted = accept(rows, drafts_of, drawn[:num_verify])
            now = accepted.samples + list(zip(sampled, drawn[num_verify:], strict=True))
            if self.drafter is not None and self.needs_hidden:
                step = self._target_step(batch, rows, accepted, now, hidden)
                with t.numerics(is_decode=not prefills), self._drafter_span("draft_observe"):
                    self.drafter.observe(step)
        return ModelOutput(
            samples=tuple(before + now), prompt_logprobs=prompt_logprobs, spec=accepted.outcomes
        )

    def decode_hidden(self, seqs: Sequence[ScheduledSeq]) -> torch.Tensor | None:
        """With a drafter that reads hidden states: a copy of a plain decode step's final hidden
        rows, when the step replayed a decode graph over every row (None otherwise: the drafter
        then misses these rows, which makes its drafts worse, never wrong)."""
        graphs = self.target.graphs
        if not self.needs_hidden or graphs is None or not seqs:
            return None
        if not all(s.is_decode for s in seqs):
            return None
        bucket = graphs.bucket_for(len(seqs))
        if bucket is None or any(s.num_prompt_logprobs for s in seqs):
            return None
        return graphs.hidden(bucket, len(seqs)).clone()

    def observe_in_flight(
        self, seqs: Sequence[ScheduledSeq], hidden: torch.Tensor, token_ids: torch.Tensor
    ) -> None:
        """Hand the drafter a plain decode step that overlaps the next: one row per request, the
        token after each still in flight on the device."""
        assert self.drafter is not None
        step = TargetStep(
            seqs=tuple(seqs),
            rows_per_seq=(1,) * len(seqs),
            start_positions=tuple(s.num_cached_tokens for s in seqs),
            hidden=hidden,
            next_token_ids=token_ids,  # the step's own draw: no later step writes it
        )
        with self.target.numerics(is_decode=True), self._drafter_span("draft_observe"):
            self.drafter.observe(step)

    @property
    def observes_prompts_in_flight(self) -> bool:
        """Whether the drafter takes a prompt chunk's rows from a step that overlaps the next
        (MTP: its head runs over them on the device at once, no host read needed), so such a
        step need not be read at once (`observe_prompts_in_flight`)."""
        # getattr: a wrapping or stand-in drafter (tests, benchmarks) may not declare it
        return self.drafter is not None and bool(
            getattr(self.drafter, "observes_prompts_in_flight", False)
        )

    def observe_prompts_in_flight(
        self,
        decodes: Sequence[ScheduledSeq],
        decode_hidden: torch.Tensor | None,
        prefills: Sequence[ScheduledSeq],
        prompt_hidden: torch.Tensor,
        inflight: StepInFlight | None,
    ) -> None:
        """Hand the drafter a step with prompt chunks that overlaps the next: every prompt row
        (prompt_hidden: the chunks' every row, in order) and the decode rows (decode_hidden:
        one row each, None: the drafter misses them, which makes drafts worse, never wrong).
        A row's next token is the prompt's where the prompt has it, else the step's own draw,
        still in flight on the device (`inflight`: this step's draws, in its sampled order)."""
        assert self.drafter is not None
        drawn_row = {id(s): i for i, s in enumerate(inflight.seqs)} if inflight else {}
        host_ids: list[int] = []
        late_at: list[int] = []  # rows whose next token is in flight
        late_from: list[int] = []  # ... its row among the step's draws
        for seq in decodes:
            late_at.append(len(host_ids))
            late_from.append(drawn_row[id(seq)])
            host_ids.append(0)
        for seq in prefills:
            start, n = seq.num_cached_tokens, seq.num_new_tokens
            after = seq.req.token_ids[start + 1 : start + n + 1]
            host_ids += after
            if len(after) < n:  # the chunk's last row: the token it samples
                late_at.append(len(host_ids))
                late_from.append(drawn_row[id(seq)])
                host_ids.append(0)
        device = self.target.device
        ids = host_to_device(torch.tensor(host_ids, dtype=torch.int64), device)
        if late_at and inflight is not None:
            idx = host_to_device(torch.tensor([late_at, late_from], dtype=torch.int64), device)
            ids[idx[0]] = inflight.token_ids[idx[1]]
        parts = [decode_hidden] if decodes and decode_hidden is not None else []
        step = TargetStep(
            seqs=(*decodes, *prefills),
            rows_per_seq=(*(1 for _ in decodes), *(s.num_new_tokens for s in prefills)),
            start_positions=tuple(s.num_cached_tokens for s in (*decodes, *prefills)),
            hidden=torch.cat([*parts, prompt_hidden]) if parts else prompt_hidden,
            next_token_ids=ids,
        )
        # The prefill numerics, as a step read at once ran the head over a prompt under.
        with self.target.numerics(is_decode=False), self._drafter_span("draft_observe"):
            self.drafter.observe(step)

    def _drafter_span(self, kind: StepSpan) -> AbstractContextManager[object]:
        """The observer's span around one drafter call, on the current (the runner's) stream."""
        if self.observer is None:
            return observed(None, kind, None)
        device = self.target.device
        stream = torch.cuda.current_stream(device) if device.type == "cuda" else None
        return observed(self.observer, kind, stream)

    def _propose(self, drafter: Drafter, seqs: list[ScheduledSeq], wanted: list[int]) -> Drafts:
        """The drafter's drafts, left on the device where it can (`propose_drafts`)."""
        # getattr: an optional method (MTP has it; wrapping drafters may pass it on)
        on_device = getattr(drafter, "propose_drafts", None)
        if on_device is not None:
            proposed: Drafts = on_device(seqs, wanted)
            return proposed.capped(wanted)  # ids: argmaxes over the lm_head, all in vocabulary
        return Drafts.on_host(self._valid(drafter.propose(seqs, wanted), wanted))

    def _valid(self, drafts: list[list[int]], wanted: list[int]) -> list[list[int]]:
        """Each row's drafts up to what it may verify, cut before any id outside the vocabulary
        (a drafter's bug must not fail the step)."""
        vocab = self.target.vocab_size
        out: list[list[int]] = []
        for row, k in zip(drafts, wanted, strict=True):
            row = row[:k]
            bad = next((j for j, t in enumerate(row) if not 0 <= t < vocab), len(row))
            out.append(row[:bad])
        return out

    def _decode_rows(
        self,
        seqs: list[ScheduledSeq],
        drafts: Drafts,
        logits: list[torch.Tensor],
        hidden: list[torch.Tensor],
        inflight: StepInFlight | None,
    ) -> tuple[VerifyRows, Callable[[torch.Tensor], None] | None]:
        """The decode rows' forward: a verify (graphed when a bucket holds it) when any row has
        drafts, else a plain decode; appends logits (and hidden states) in the rows' order.
        Drafts still on the device feed the verify's input ids there.
        -> the rows, and after a verify what commits the accepted positions' GDN states given
        the rows' draws on the device (acceptance runs there: `num_kept_on_device`)."""
        t = self.target
        rows = layout_verify(seqs, drafts.counts)
        if len(rows.row_seqs) == len(seqs):  # no drafts: a plain decode step
            self._plain(seqs, logits, hidden, inflight)
            return rows, None
        sources = inflight.source_rows(seqs) if inflight is not None else [None] * len(seqs)
        index = {id(s): i for i, s in enumerate(seqs)}
        tapped = torch.empty(0)  # the rows' tap layers' states, with a block drafter
        graphs = t.verify_graphs
        bucket = graphs.bucket_for(len(seqs)) if graphs is not None else None
        if graphs is not None and bucket is not None:
            rank = {id(s): i for i, s in enumerate(seqs)}
            out = graphs.run(seqs, drafts, bucket, sources, inflight)
            picks = [
                graphs.graph_row(bucket, j, rank[id(s)])
                for s, j in zip(rows.row_seqs, rows.row_positions, strict=True)
            ]
            picked = host_to_device(torch.tensor(picks, dtype=torch.int64), t.device)
            h = out[picked]
            if self.needs_taps:  # the graphs were captured tapped (the runner's use_taps)
                tapped = graphs.tapped(bucket)[picked]

            def commit(drawn: torch.Tensor) -> None:  # the graph's sequence i is seqs[i]
                kept = num_kept_on_device(rows, drafts, index, seqs, bucket, drawn)
                graphs.commit(bucket, kept)

        else:
            batch = verify_batch(
                rows, caches=t.caches, block_size=t.config.block_size, device=t.device
            )
            layout = batch.verify
            assert layout is not None

            def commit(drawn: torch.Tensor) -> None:
                order = rows.seq_order
                kept = num_kept_on_device(rows, drafts, index, order, len(order), drawn)
                t.model.commit_verify(t.caches, layout, kept)

            feeds = {id(s): x for s, x in zip(seqs, sources, strict=True)}
            staged = verify_input_ids(rows, feeds, drafts, index)
            dev = host_to_device(torch.tensor(staged, dtype=torch.int64), t.device)
            input_ids = drafts.merge_into(merge_inflight_inputs(dev[0], dev[1], inflight), dev[2])
            if self.needs_taps:
                h, tapped = forward_tapped(t.model, input_ids, batch)
            else:
                h = t.model(input_ids, batch)
        logits.append(t.model.compute_logits(h))
        hidden.append(tapped if self.needs_taps else h)  # a block drafter reads the taps
        return rows, commit

    def _plain(
        self,
        seqs: list[ScheduledSeq],
        logits: list[torch.Tensor],
        hidden: list[torch.Tensor],
        inflight: StepInFlight | None,
        prompt_logprobs: dict[str, tuple[TokenLogprob, ...]] | None = None,
    ) -> None:
        """A forward as in a step not read at once (graphed where it can be); when the drafter
        needs the rows' hidden states (their taps, for a block drafter) a decode graph's or an
        eager forward's over every row."""
        t = self.target
        scores = {} if prompt_logprobs is None else prompt_logprobs
        if self.needs_hidden:
            graphed = self._plain_graphed(seqs, inflight)
            out, h = graphed or t.forward_eager(
                seqs, scores, inflight, all_rows=True, use_taps=self.needs_taps
            )
            logits.append(out)
            hidden.append(h)
        else:
            logits.append(t.forward(seqs, scores, inflight))

    def _plain_graphed(
        self, seqs: list[ScheduledSeq], inflight: StepInFlight | None
    ) -> tuple[torch.Tensor, torch.Tensor] | None:
        """Decode rows replayed on a decode graph -> (logits, hidden rows: the tap layers' with
        a block drafter, whose graphs the runner captured tapped); None: run eagerly."""
        graphs = self.target.graphs
        if graphs is None or not all(s.is_decode for s in seqs):
            return None
        if any(s.num_prompt_logprobs for s in seqs):
            return None
        bucket = graphs.bucket_for(len(seqs))
        if bucket is None:
            return None
        sources = inflight.source_rows(seqs) if inflight is not None else [None] * len(seqs)
        logits = graphs.run(seqs, bucket, sources, inflight)
        if self.needs_taps:
            return logits, graphs.tapped(bucket, len(seqs))
        return logits, graphs.hidden(bucket, len(seqs))

    def _draw(
        self,
        rows: VerifyRows,
        drafts: Drafts,
        decodes: list[ScheduledSeq],
        sampled: list[ScheduledSeq],
        logits: list[torch.Tensor],
        inflight: StepInFlight | None,
        known: dict[Request, int],
    ) -> StepDraws | None:
        """A token for every verify row, then every sampled prompt chunk, on the device, their
        copy to the host queued (`StepDraws.read`; None: no row draws): a request's verify row
        j draws its output at index output_idx + j, taking its drafts before j as outputs
        (penalties count them, a grammar reads them: only then are drafts still on the device
        read before the draw)."""
        seqs = [*rows.row_seqs, *sampled]
        if not seqs:
            return None
        pairs = zip(rows.row_seqs, rows.row_positions, strict=True)
        idxs = [s.output_idx + j for s, j in pairs] + [s.output_idx for s in sampled]
        prefixes: list[list[int]] = []
        if any(j for j in rows.row_positions) and any(
            Sampler.counts_outputs(s.req) or Sampler.needs_host_history(s.req)
            for s in rows.row_seqs
        ):
            of = {id(s): d for s, d in zip(decodes, drafts.host(), strict=True)}
            pairs = zip(rows.row_seqs, rows.row_positions, strict=True)
            prefixes = [of[id(s)][:j] for s, j in pairs] + [[] for _ in sampled]
        out = logits[0] if len(logits) == 1 else torch.cat(logits)
        reqs = [s.req for s in seqs]
        late: list[torch.Tensor | None] = []
        if inflight is not None and any(map(Sampler.counts_outputs, reqs)):
            late = inflight.outputs_of(seqs)
        pending = [known.get(req) for req in reqs] if known else []
        sampler = self.target.sampler
        drawn = sampler.draw(out, reqs, idxs, late, pending, draft_prefixes=prefixes)
        return StepDraws(drawn)

    def _target_step(
        self,
        batch: ScheduledBatch,
        rows: VerifyRows,
        accepted: Accepted,
        samples: list[tuple[ScheduledSeq, SampledToken]],
        hidden: list[torch.Tensor],
    ) -> TargetStep:
        """The step's accepted rows, each with the token after it, for the drafter."""
        sampled: dict[int, list[int]] = {}
        for seq, sample in samples:
            sampled.setdefault(id(seq), []).append(sample.token_id)
        decodes = [s for s in batch.seqs if s.is_decode]
        prefills = [s for s in batch.seqs if not s.is_decode]
        picks: list[int] = []  # rows of the concatenated hidden states
        counts: list[int] = []
        next_ids: list[int] = []
        for seq in decodes:
            n = accepted.num_rows[id(seq)]
            picks += [rows.row_index[(id(seq), j)] for j in range(n)]
            counts.append(n)
            next_ids += sampled[id(seq)][:n]
        offset = len(rows.row_seqs)
        for seq in prefills:
            n, start = seq.num_new_tokens, seq.num_cached_tokens
            picks += range(offset, offset + n)
            offset += n
            counts.append(n)
            after = seq.req.token_ids[start + 1 : start + n + 1]
            next_ids += after + sampled.get(id(seq), [])[: n - len(after)]
        device = self.target.device
        dev = host_to_device(torch.tensor([picks, next_ids], dtype=torch.int64), device)
        return TargetStep(
            seqs=(*decodes, *prefills),
            rows_per_seq=tuple(counts),
            start_positions=tuple(s.num_cached_tokens for s in (*decodes, *prefills)),
            hidden=torch.cat(hidden)[dev[0]],
            next_token_ids=dev[1],
        )
