"""The MTP drafter: the checkpoint's multi-token-prediction head (`model.mtp`) proposes drafts from
the target's final hidden states (docs/model.md §10).

The head runs over each accepted target row, row p paired with the token that follows it, and
writes its KV at index p of its own cache (the target's block tables; a verify's rejected rows
are overwritten when their positions are accepted later). The last such row of a request (its
tail) gives its first draft, d1 = argmax of the target's lm_head over the head's output there. A
request that drafts k tokens at its next step (`propose`) gets d1 and k - 1 more head steps,
each feeding the draft before and the head's output before (one row per request, batched over
the step's requests).

Lazily: `observe` only keeps a decode step's accepted rows (their hidden states and next tokens)
per request; the head runs over them when the request drafts next (`propose`, one batched
forward over every request that catches up), when a request has kept `MAX_PENDING_ROWS` of them,
and at once for prompt chunks (so a prompt's head KV is written before its blocks can be shared
through the prefix cache). A request whose drafting is off (adaptive cool-down, or the cost
model) so costs the head nothing per step: an MTP engine whose drafts are never accepted runs
close to plain-decode speed, its plain steps replaying the decode graphs and overlapping the
next step (`SpeculativeStep.observe_in_flight` hands their rows over on the device, the tokens still
in flight), and pays one catch-up forward over the rows of a stretch when it probes again.
The head's work so lands in the steps that draft, whose times feed the cost model's verify fit
(`speculative.policy`). Positions decoded while drafting is off keep no head KV until then: a draft
reading them through a shared prefix block may be worse, never wrong (every draft is
verified).

Drafting keeps the device busy: d1 and every later draft are argmaxed on the device and fed
device to device into the next head step, whose batch (positions, KV slots, context lengths) is
the one before advanced by one on the device; the drafts stay there (`propose_drafts`): the
verify takes them as its input ids on the device, and their one copy to the host, queued behind
them, is read with the step's drawn tokens. In the steady state (every drafting request with 1
to k + 1 pending rows) the catch-up and the draft steps replay one CUDA graph (`graphs.head`); a
request back from a stretch without drafts first runs the head eagerly over all but its last k +
1 rows, so the drafts still replay the graph. The head runs under the target's decode numerics,
so it builds no kernel variant of its own while serving. The drafts are greedy, so the verify's
acceptance equals rejection sampling's (`rejection_sampler`). Each draft's logits read the
lm_head's first `speculative_draft_vocab` rows only (a view; by default 65,536 of Qwen's
248,320, a quarter of the bytes: the full lm_head was the head's main cost at batch 1); a token
past them is never drafted, and the verify emits it as it would without drafts.
"""

from __future__ import annotations

import weakref
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

import torch
from sparkinfer.model.cache_spec import ModelCaches
from sparkinfer.model.forward_batch import ForwardBatch, host_to_device
from sparkinfer.model.layers.embedding import LMHead
from sparkinfer.model.mtp import MTPHead
from sparkinfer.scheduler._causal_lm import CausalLM
from sparkinfer.scheduler.batch import ScheduledBatch, ScheduledSeq
from sparkinfer.scheduler.graphs.head import HeadGraphs, advance_draft_batch
from sparkinfer.scheduler.request import Request
from sparkinfer.scheduler.speculative.drafter import Drafts, TargetStep

MAX_PENDING_ROWS = 64  # a request's rows kept before the head runs over them anyway


@dataclass
class _Pending:
    """A request's accepted target rows the head has not run over yet: positions start onwards,
    their hidden states and the token after each (device tensors, in step pieces)."""

    start: int
    hidden: list[torch.Tensor] = field(default_factory=list[torch.Tensor])
    next_ids: list[torch.Tensor] = field(default_factory=list[torch.Tensor])
    num_rows: int = 0

    @property
    def end(self) -> int:
        return self.start + self.num_rows

    def add(self, hidden: torch.Tensor, next_ids: torch.Tensor) -> None:
        self.hidden.append(hidden)
        self.next_ids.append(next_ids)
        self.num_rows += hidden.shape[0]

    def joined(self) -> tuple[torch.Tensor, torch.Tensor]:
        """(hidden [n, hidden], next ids [n]) of every pending row, in order."""
        return _cat(self.hidden), _cat(self.next_ids)


def _cat(pieces: list[torch.Tensor]) -> torch.Tensor:
    return pieces[0] if len(pieces) == 1 else torch.cat(pieces)


@dataclass(frozen=True)
class _Tail:
    """A request's last head row: its target position and the head's output there [hidden]."""

    position: int
    hidden: torch.Tensor


class MTPDrafter:
    """Owns the head's per-request pending rows and tails (its KV lives in the runner's caches)."""

    needs_hidden = True
    needs_taps = False
    observes_prompts_in_flight = True  # a prompt step overlaps the next (`must_read`)

    def __init__(
        self,
        model: CausalLM,
        head: MTPHead,
        caches: ModelCaches,
        *,
        block_size: int,
        device: torch.device,
        draft_vocab: int = 0,
    ) -> None:
        self.model = model
        self.head = head
        # A slice of the lm_head for the drafts' logits (`speculative_draft_vocab`), where the
        # model has one to slice and the slice is smaller than it.
        lm_head = getattr(model, "lm_head", None)
        is_subset = isinstance(lm_head, LMHead) and 0 < draft_vocab < lm_head.weight.shape[0]
        self._draft_head = lm_head if is_subset else None
        self.draft_vocab = draft_vocab if is_subset else 0
        self.caches = caches
        self.block_size = block_size
        self.device = device
        # Dropped with the request: a finished request leaves nothing behind.
        self._pending: weakref.WeakKeyDictionary[Request, _Pending] = weakref.WeakKeyDictionary()
        self._tails: weakref.WeakKeyDictionary[Request, _Tail] = weakref.WeakKeyDictionary()
        self.graphs: HeadGraphs | None = None  # captured by `capture_graphs` (CUDA)

    def draft_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """Logits a draft is argmaxed from: over the draft vocabulary, or the whole one."""
        if self._draft_head is not None:
            return self._draft_head(hidden, self.draft_vocab)
        return self.model.compute_logits(hidden)

    def capture_graphs(
        self,
        *,
        batch_sizes: Sequence[int],
        num_drafts: int,
        max_blocks_per_seq: int,
        stream: torch.cuda.Stream,
    ) -> None:
        """Capture the head's catch-up and draft steps for these buckets (`graphs.head`)."""
        graphs = HeadGraphs(
            self.model,
            self.head,
            self.caches,
            batch_sizes=batch_sizes,
            num_drafts=num_drafts,
            max_blocks_per_seq=max_blocks_per_seq,
            block_size=self.block_size,
            hidden_size=self.head.config.hidden_size,
            dtype=next(self.head.parameters()).dtype,
            stream=stream,
            draft_logits=self.draft_logits,
        )
        with torch.inference_mode():
            graphs.capture()
        self.graphs = graphs

    def warm_up(self, row_counts: Iterable[int]) -> None:
        """Run the head once over each of these catch-up row counts, one request after a block
        of context, so a catch-up mid-serving builds no kernel variant (call under the
        numerics of the steps it warms; it writes head KV to the first blocks, which hold no
        request's KV before serving)."""
        bs = self.block_size
        for n in row_counts:
            table = list(range(-(-(bs + n) // bs)))
            batch = ForwardBatch.build(
                [n], [bs], [table], [0], caches=self.caches, block_size=bs, device=self.device
            )
            ids = torch.zeros(n, dtype=torch.int64, device=self.device)
            embeds = self.model.embed_input_ids(ids)
            self.head(embeds, torch.zeros_like(embeds), batch)

    def must_read(self, batch: ScheduledBatch, *, is_overlapped: bool) -> bool:
        """Every step where steps do not overlap (the head takes a step's rows on the device only
        from a step in flight). A step with prompt chunks overlaps the next like any other: the
        head still runs over a prompt within it, on the device (its KV written before the prefix
        cache can share the blocks), the row that samples taking the draw still in flight
        (`SpeculativeStep.observe_prompts_in_flight`)."""
        return not is_overlapped

    def observe(self, step: TargetStep) -> None:
        """Keep the step's accepted target rows; run the head over prompt chunks' at once."""
        due: list[ScheduledSeq] = []
        offset = 0
        for seq, n, start in zip(step.seqs, step.rows_per_seq, step.start_positions, strict=True):
            pending = self._pending.get(seq.req)
            if pending is None or pending.end != start:  # a fresh run (or a recomputed one)
                pending = self._pending[seq.req] = _Pending(start)
            pending.add(step.hidden[offset : offset + n], step.next_token_ids[offset : offset + n])
            offset += n
            if not seq.is_decode or pending.num_rows >= MAX_PENDING_ROWS:
                due.append(seq)
        if due:
            self._catch_up(due)

    def propose(self, seqs: Sequence[ScheduledSeq], num_drafts: Sequence[int]) -> list[list[int]]:
        """Up to num_drafts[i] drafts for each decode row whose rows the head has run through
        (after catching up) up to right before it, on the host (`propose_drafts`, read)."""
        return self.propose_drafts(seqs, num_drafts).host()

    def propose_drafts(self, seqs: Sequence[ScheduledSeq], num_drafts: Sequence[int]) -> Drafts:
        """`propose`'s drafts left on the device: a row drafts num_drafts[i] tokens when the head
        has run through its rows up to right before it, else none (known on the host at once);
        each id an argmax over the lm_head's rows, so inside the vocabulary."""
        graphed = self._propose_graphed(seqs, num_drafts)
        if graphed is not None:
            return graphed
        behind = [
            s
            for s, k in zip(seqs, num_drafts, strict=True)
            if k and (p := self._pending.get(s.req)) is not None and p.end == s.num_cached_tokens
        ]
        if behind:
            self._catch_up(behind)
        going = [
            i
            for i, (s, k) in enumerate(zip(seqs, num_drafts, strict=True))
            if k
            and (t := self._tails.get(s.req)) is not None
            and t.position == s.num_cached_tokens - 1
        ]
        if not going:
            return Drafts.on_host([[] for _ in seqs])
        rows = [seqs[i] for i in going]
        counts = [num_drafts[i] for i in going]
        hidden = torch.stack([self._tails[s.req].hidden for s in rows])
        drafts = [self.draft_logits(hidden).argmax(dim=-1)]
        batch: ForwardBatch | None = None
        for step in range(1, max(counts)):
            if batch is None:
                batch = self._draft_batch(rows, counts)
            else:
                batch = _advance(batch, counts, step, block_size=self.block_size)
            hidden = self.head(self.model.embed_input_ids(drafts[-1]), hidden, batch)
            drafts.append(self.draft_logits(hidden).argmax(dim=-1))
        return _on_device(torch.stack(drafts, dim=1), going, num_drafts)

    def _propose_graphed(
        self, seqs: Sequence[ScheduledSeq], num_drafts: Sequence[int]
    ) -> Drafts | None:
        """The drafts from one replay of a head graph, when one holds the step: every request
        that drafts has 1 to k + 1 pending rows, ending right before its input (else None)."""
        graphs = self.graphs
        going = [i for i, k in enumerate(num_drafts) if k]
        bucket = graphs.bucket_for(len(going)) if graphs is not None and going else None
        if graphs is None or bucket is None:
            return None
        pending: list[_Pending] = []
        for i in going:
            p = self._pending.get(seqs[i].req)
            if p is None or p.end != seqs[i].num_cached_tokens:
                return None
            if num_drafts[i] > graphs.num_drafts:
                return None
            pending.append(p)
        long = [
            i for i, p in zip(going, pending, strict=True) if p.end - p.start > graphs.rows_per_seq
        ]
        if long:  # rows kept while drafting was off: all but the graph's last ones run eagerly
            self._catch_up_older([seqs[i] for i in long], keep=graphs.rows_per_seq)
            pending = [self._pending[seqs[i].req] for i in going]
        rows = [
            (p.num_rows, self._position_values([seqs[i]], [p.start], [p.num_rows]), p.start)
            for i, p in zip(going, pending, strict=True)
        ]
        hidden = _cat([h for p in pending for h in p.hidden])
        next_ids = _cat([t for p in pending for t in p.next_ids])
        counts = [num_drafts[i] for i in going]
        tables = [seqs[i].req.block_ids for i in going]
        drafts, tails = graphs.run(bucket, rows, tables, counts, hidden, next_ids)
        # Copies: the graph's buffers are rewritten by its next replay.
        drafts, tails = drafts.clone(), tails.clone()
        for row, (i, p) in enumerate(zip(going, pending, strict=True)):
            req = seqs[i].req
            del self._pending[req]
            self._tails[req] = _Tail(p.end - 1, tails[row])
        return _on_device(drafts, going, num_drafts)

    def _catch_up_older(self, seqs: list[ScheduledSeq], *, keep: int) -> None:
        """One head forward over all but the last `keep` pending rows of each of these requests
        (each has more); the last ones stay pending."""
        older: list[_Pending] = []
        for seq in seqs:
            p = self._pending[seq.req]
            hidden, next_ids = p.joined()
            n = p.num_rows - keep
            older.append(_Pending(p.start, [hidden[:n]], [next_ids[:n]], n))
            self._pending[seq.req] = _Pending(p.start + n, [hidden[n:]], [next_ids[n:]], keep)
        self._run_head(seqs, older)

    def _catch_up(self, seqs: list[ScheduledSeq]) -> None:
        """One head forward over these requests' pending rows; keeps each one's tail."""
        self._run_head(seqs, [self._pending.pop(s.req) for s in seqs])

    def _run_head(self, seqs: list[ScheduledSeq], pending: list[_Pending]) -> None:
        """The head over each request's rows in `pending` (in order); keeps each one's tail."""
        counts = [p.num_rows for p in pending]
        starts = [p.start for p in pending]
        batch = ForwardBatch.build(
            counts,
            starts,
            [s.req.block_ids for s in seqs],
            [0] * len(seqs),  # the head keeps no recurrent state
            caches=self.caches,
            block_size=self.block_size,
            device=self.device,
            positions=self._positions(seqs, starts, counts),
        )
        next_ids = _cat([t for p in pending for t in p.next_ids])
        hidden = _cat([h for p in pending for h in p.hidden])
        out = self.head(self.model.embed_input_ids(next_ids), hidden, batch)
        last = -1
        for seq, start, n in zip(seqs, starts, counts, strict=True):
            last += n
            self._tails[seq.req] = _Tail(start + n - 1, out[last])

    def _draft_batch(self, seqs: list[ScheduledSeq], counts: list[int]) -> ForwardBatch:
        """The first draft step's batch: one head row per request at cache index num_cached
        (the position after its input token); rows with one draft write nothing."""
        starts = [s.num_cached_tokens for s in seqs]
        batch = ForwardBatch.build(
            [1] * len(seqs),
            starts,
            [s.req.block_ids for s in seqs],
            [0] * len(seqs),
            caches=self.caches,
            block_size=self.block_size,
            device=self.device,
            positions=self._positions(seqs, starts, [1] * len(seqs)),
        )
        if min(counts) <= 1:
            batch = _advance(batch, counts, 1, block_size=self.block_size, by=0)
        return batch

    def _positions(
        self, seqs: Sequence[ScheduledSeq], starts: Sequence[int], counts: Sequence[int]
    ) -> torch.Tensor:
        values = self._position_values(seqs, starts, counts)
        return host_to_device(torch.tensor(values, dtype=torch.int64), self.device)

    @staticmethod
    def _position_values(
        seqs: Sequence[ScheduledSeq], starts: Sequence[int], counts: Sequence[int]
    ) -> list[int]:
        """Rotary positions of the rows: each one the position of the token it embeds (its
        cache index + 1), offset by the request's rope_delta past an image."""
        return [
            start + 1 + r + (s.req.rope_delta if start + 1 + r >= s.req.num_prompt_tokens else 0)
            for s, start, n in zip(seqs, starts, counts, strict=True)
            for r in range(n)
        ]


def _on_device(ids: torch.Tensor, going: list[int], num_drafts: Sequence[int]) -> Drafts:
    """Drafts ids [len(going), >= k] on the device: row r is decode row going[r]'s."""
    rows = [-1] * len(num_drafts)
    for r, i in enumerate(going):
        rows[i] = r
    counts = [k if rows[i] >= 0 else 0 for i, k in enumerate(num_drafts)]
    return Drafts(counts, ids=ids, rows=rows)


def _advance(
    batch: ForwardBatch, counts: list[int], step: int, *, block_size: int, by: int = 1
) -> ForwardBatch:
    """Draft step `step`'s batch from the one before: rows with counts[b] > step move on."""
    active = None
    if min(counts) <= step:
        ks = host_to_device(torch.tensor(counts, dtype=torch.int32), batch.cached_lens.device)
        active = ks > step
    return advance_draft_batch(batch, active, block_size=block_size, by=by)
