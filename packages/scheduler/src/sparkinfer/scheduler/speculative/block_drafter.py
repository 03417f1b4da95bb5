"""The block drafter of `--draft-model` (DFlash, DFlash2, DSpark; docs/model.md §17) as a
`Drafter`: one forward of its own proposes a request's whole block of drafts.

Context: every step of an engine with this drafter is read at once (`must_read`: the next block
starts at the last accepted token, and its context must be written first), and its target
forwards return the drafter's tap layers (`forward_tapped`, the same pass: no extra forward),
under the runner's decode and verify graphs too (captured tapped; eager where no bucket holds
the rows, and for prompt chunks). `observe` gets the tapped rows of every accepted position,
prompt chunks and verified rows alike, and writes their K/V into the drafter's cache at once
(a decode step's few rows through a CUDA graph per rows bucket, `graphs.drafter_context`,
captured with the proposal's; padding rows write to a dump page of the drafter's own).
That cache is paged with the target's block tables (a position's drafter K/V depend only on the
tokens up to it), so a prefix-cache hit brings the drafter's context along with the target's.

Proposal: a decode row whose context is written up to right before its input token (the anchor,
at position P = num_cached) gets a block at P: the drafter writes its block rows' K/V at P ..
P + block_size - 1 as scratch and returns up to `num_drafts` tokens. The scratch never outlives
the step where it matters: the accepted positions are overwritten by `observe` in the same step,
and the rest lie at or past the request's next num_cached, which no prefix-cache block holds
until a later `observe` has written them. Positions past a request's own pages go to scratch
pages of the drafter's own (`SCRATCH_PAGES` per row), never to another request's.

Shapes: over pages of at least 16 positions (`BlockDrafter.reads_paged`: the engine's) a
proposal attends over its pages (the decode kernel, or the block kernel under a window), each
row's length read on the device, so it runs as one CUDA graph per rows bucket, all captured at
start-up (`use_graphs`): no step pays a capture or runs eagerly for a longer context. Over
smaller pages (tests) a proposal gathers `num_keys` context positions per row,
rounded up to a keys bucket (`key_bucket`: a multiple of the page size and of `MIN_KEY_BUCKET`,
eight buckets per doubling), so consecutive steps repeat one shape instead of growing it by the
tokens each step accepted, and runs as a CUDA graph per (rows bucket, keys bucket), each
captured the first time a step needs it (`graphs.block_drafter`; eager where no graph holds the
shape). The rows past a row's context are masked, so the bucket changes no draft.

A request whose context has a gap (none is expected: every step is observed) gets no drafts,
which makes it slower, never wrong (every draft is verified). The drafts are greedy picks of
the drafter's scores, so the verify's acceptance equals rejection sampling's for them.
"""

from __future__ import annotations

import logging
import math
import weakref
from collections.abc import Sequence

import numpy as np
import torch
from sparkinfer.model.drafters.cache import allocate_drafter_cache
from sparkinfer.model.drafters.dflash import BlockDrafter
from sparkinfer.model.forward_batch import host_to_device
from sparkinfer.scheduler.batch import ScheduledBatch, ScheduledSeq
from sparkinfer.scheduler.errors import GraphCaptureError
from sparkinfer.scheduler.graphs.block_drafter import BlockDrafterGraphs
from sparkinfer.scheduler.graphs.drafter_context import DrafterContextGraphs
from sparkinfer.scheduler.request import Request
from sparkinfer.scheduler.sampler import host_list
from sparkinfer.scheduler.speculative.drafter import TargetStep

logger = logging.getLogger(__name__)

MAX_GRAPHED_CONTEXT_ROWS = 512  # a decode step's context writes of more rows run eagerly
MIN_KEY_BUCKET = 256  # the smallest step between two keys buckets
KEY_BUCKETS_PER_DOUBLING = 8  # at most 1/8 more positions read than the longest row needs


def key_bucket(num_keys: int, block_size: int) -> int:
    """The keys bucket holding num_keys positions: a multiple of the page size (block_size)
    and of MIN_KEY_BUCKET, in steps of a KEY_BUCKETS_PER_DOUBLING-th of the power of two below."""
    below = 1 << max(0, (num_keys - 1).bit_length() - 1)  # the power of two below num_keys
    step = math.lcm(block_size, max(MIN_KEY_BUCKET, below // KEY_BUCKETS_PER_DOUBLING))
    return -(-num_keys // step) * step


def scratch_pages(block_len: int, block_size: int) -> int:
    """Pages a block of block_len rows may reach past a request's own pages."""
    return block_len // block_size + 2


class DraftModelDrafter:
    """Owns the block drafter's paged KV cache and how far each request's context is written.

    Args:
        drafter: the loaded block drafter (its target's tap layers set).
        num_blocks: the target's KV blocks (the drafter's pages share their ids).
        block_size: tokens per page.
        max_seqs: most requests drafting in one step (each gets its own scratch pages).
    """

    needs_hidden = True
    needs_taps = True

    def __init__(
        self,
        drafter: BlockDrafter,
        *,
        num_blocks: int,
        block_size: int,
        max_seqs: int,
        device: torch.device,
    ) -> None:
        self.drafter = drafter
        self.num_drafts = drafter.config.num_drafts
        self.block_size = block_size
        self.device = device
        self._block_len = drafter.config.block_size
        self._scratch = scratch_pages(self._block_len, block_size)
        self._first_scratch = num_blocks
        self.max_seqs = max_seqs
        # The target's pages, each row's scratch pages, and one dump page (the graphed context
        # writes' padding rows write there).
        dump_page = num_blocks + max_seqs * self._scratch
        self._dump_row = dump_page * block_size
        self.cache = allocate_drafter_cache(
            drafter.cache_spec(), num_blocks=dump_page + 1, block_size=block_size, device=device
        )
        # Context positions written (0 .. n - 1) per request; dropped with the request.
        self._written: weakref.WeakKeyDictionary[Request, int] = weakref.WeakKeyDictionary()
        self.graphs: BlockDrafterGraphs | None = None  # `use_graphs`
        self.context_graphs: DrafterContextGraphs | None = None  # `use_graphs`

    def use_graphs(
        self, *, row_sizes: Sequence[int], max_context: int, stream: torch.cuda.Stream
    ) -> None:
        """Propose under CUDA graphs (`graphs.block_drafter`) for up to the largest of
        row_sizes rows (those above max_seqs dropped) and contexts up to max_context tokens:
        under a paged attention every rows bucket's graph is captured now (under the caller's
        numerics, those of the steps that replay it), else each the first time a step needs
        it. A failed capture leaves the proposals eager (the same drafts, slower)."""
        sizes = sorted({min(n, self.max_seqs) for n in row_sizes if n > 0})
        if not sizes:
            return
        max_keys = key_bucket(max_context + self._block_len, self.block_size)
        width = max_keys // self.block_size
        pad = [[self._first_scratch + r * self._scratch] * width for r in range(sizes[-1])]
        self.graphs = BlockDrafterGraphs(
            self.drafter,
            self.cache,
            row_sizes=sizes,
            max_keys=max_keys,
            pad_tables=torch.tensor(pad, dtype=torch.int64),
            stream=stream,
        )
        try:
            self.context_graphs = DrafterContextGraphs(
                self.drafter,
                self.cache,
                max_rows=min(sizes[-1] * self._block_len, MAX_GRAPHED_CONTEXT_ROWS),
                dump_row=self._dump_row,
                stream=stream,
            )
        except (GraphCaptureError, RuntimeError):
            self.context_graphs = None
            logger.warning("capturing the block drafter's context writes failed: they run "
                           "eagerly", exc_info=True)  # fmt: skip
        if not self.graphs.is_paged:
            return
        try:
            self.graphs.capture_all()
        except (GraphCaptureError, RuntimeError):
            self.graphs = None
            logger.warning("capturing the block drafter's graphs failed: it runs eagerly",
                           exc_info=True)  # fmt: skip

    def must_read(self, batch: ScheduledBatch, *, is_overlapped: bool) -> bool:
        """Always: every accepted position's taps must reach the drafter's cache."""
        return True

    def observe(self, step: TargetStep) -> None:
        """Write the K/V of the step's accepted positions (step.hidden: their tapped rows)."""
        if not step.seqs:
            return
        positions: list[int] = []
        rows: list[np.ndarray] = []
        for seq, n, start in zip(step.seqs, step.rows_per_seq, step.start_positions, strict=True):
            at = np.arange(start, start + n)
            pages = np.asarray(seq.req.block_ids, dtype=np.int64)[at // self.block_size]
            rows.append(pages * self.block_size + at % self.block_size)
            positions += range(start, start + n)
        cache_rows = np.concatenate(rows)
        # A decode step's rows through a graph (a step with prompt chunks writes eagerly, under
        # the prefill numerics it runs in).
        graphs = self.context_graphs
        is_decode = all(s.is_decode for s in step.seqs)
        if not (
            is_decode and graphs is not None and graphs.run(step.hidden, positions, cache_rows)
        ):
            dev = host_to_device(
                torch.tensor(np.stack([np.asarray(positions), cache_rows])), self.device
            )
            self.drafter.write_context_rows(step.hidden, dev[0], self.cache, rows=dev[1])
        for seq, n, start in zip(step.seqs, step.rows_per_seq, step.start_positions, strict=True):
            self._written[seq.req] = start + n

    def propose(self, seqs: Sequence[ScheduledSeq], num_drafts: Sequence[int]) -> list[list[int]]:
        """Up to num_drafts[i] drafts (at most the drafter's block) for each decode row whose
        context is written up to right before its input token; one drafter forward in all."""
        out: list[list[int]] = [[] for _ in seqs]
        going = [
            i
            for i, (s, k) in enumerate(zip(seqs, num_drafts, strict=True))
            if k and not s.is_input_inflight and self._written.get(s.req) == s.num_cached_tokens
        ][: self.max_seqs]
        if not going:
            return out
        rows = [seqs[i] for i in going]
        anchors = [s.req.token_ids[s.num_cached_tokens] for s in rows]
        starts = [s.num_cached_tokens for s in rows]
        num_keys = key_bucket(max(starts) + self._block_len, self.block_size)
        tables = self._block_tables(rows, num_keys)
        tokens = self._graphed(anchors, starts, tables, num_keys)
        if tokens is None:
            dev = host_to_device(torch.tensor([anchors, starts], dtype=torch.int64), self.device)
            draft = self.drafter.propose(
                dev[0], dev[1], self.cache, block_tables=self._ints(tables), num_keys=num_keys
            )
            tokens = self.drafter.draft_tokens(draft, dev[0]).tokens
        table: list[list[int]] = host_list(tokens)  # the one wait
        for i, row in zip(going, table, strict=True):
            out[i] = row[: min(num_drafts[i], self.num_drafts)]
        return out

    def _graphed(
        self, anchors: list[int], starts: list[int], tables: list[list[int]], num_keys: int
    ) -> torch.Tensor | None:
        """The draft tokens from a graph replay; None: no graph holds the shape, or a capture
        failed (then every later proposal runs eagerly: the same drafts, slower)."""
        if self.graphs is None:
            return None
        try:
            return self.graphs.run(anchors, starts, tables, num_keys)
        except (GraphCaptureError, RuntimeError):
            self.graphs = None
            logger.warning("capturing the block drafter's graph failed: it runs eagerly",
                           exc_info=True)  # fmt: skip
            return None

    def _block_tables(self, rows: Sequence[ScheduledSeq], num_keys: int) -> list[list[int]]:
        """Each row's pages over positions 0 .. num_keys - 1: its own, then its scratch pages
        (positions past the last one are only read, and masked)."""
        width = -(-num_keys // self.block_size)
        tables: list[list[int]] = []
        for r, seq in enumerate(rows):
            own = seq.req.block_ids[:width]
            base = self._first_scratch + r * self._scratch
            extra = [base + min(j, self._scratch - 1) for j in range(width - len(own))]
            tables.append(own + extra)
        return tables

    def _ints(self, rows: list[list[int]]) -> torch.Tensor:
        return host_to_device(torch.tensor(rows, dtype=torch.int64), self.device)
