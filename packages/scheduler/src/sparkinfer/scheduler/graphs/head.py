"""The MTP head's catch-up and draft steps under CUDA graphs: one graph per batch-size bucket.

A graph's layout is fixed: bucket b, k = num_speculative_tokens, W = k + 1 catch-up rows per
request (row i * W + j: the j-th of request i's pending target rows, at most what one verify
accepts). The head holds no recurrent state, so every catch-up row runs as a decode row of its
own (cache index p, context p + 1; a row reads the KV the rows before it wrote in the same
layer, as a verify's rows do). The graph then takes each request's tail (its last real catch-up
row, `last`), argmaxes its first draft on the device, and runs k - 1 draft steps, each one row
per request one position on (`_advance`); rows with fewer drafts (`num_drafts`) stop and write
no KV. It returns the drafts [b, k] and leaves the tails' head outputs in a buffer of its pool.
Padding rows write no KV and read no context. Buffers are filled as in `graphs.decode`.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import replace

import numpy as np
import torch
from sparkinfer.model.cache_spec import ModelCaches
from sparkinfer.model.forward_batch import ForwardBatch
from sparkinfer.model.mtp import MTPHead
from sparkinfer.scheduler._causal_lm import CausalLM
from sparkinfer.scheduler.graphs.buckets import GraphBuckets
from sparkinfer.scheduler.graphs.decode_rows import DecodeRowBuffers


class HeadGraphs(DecodeRowBuffers):
    """Owns the head's static buffers and one captured graph per bucket (drafter-internal)."""

    def __init__(
        self,
        model: CausalLM,
        head: MTPHead,
        caches: ModelCaches,
        *,
        batch_sizes: Sequence[int],
        num_drafts: int,
        max_blocks_per_seq: int,
        block_size: int,
        hidden_size: int,
        dtype: torch.dtype,
        stream: torch.cuda.Stream,
        draft_logits: Callable[[torch.Tensor], torch.Tensor],
    ) -> None:
        self.model = model
        self.draft_logits = draft_logits  # hidden -> the logits a draft is argmaxed from
        self.head = head
        self.caches = caches
        self.block_size = block_size
        self.num_drafts = num_drafts
        self.rows_per_seq = num_drafts + 1
        self.batch_sizes = tuple(sorted(batch_sizes))
        self.stream = stream
        device = stream.device
        n = self.batch_sizes[-1] * self.rows_per_seq
        self._allocate_rows(n, max_blocks_per_seq, device, state_slot_fill=-1)
        self.hidden = torch.zeros(n, hidden_size, dtype=dtype, device=device)
        self.last = torch.zeros(self.batch_sizes[-1], dtype=torch.int64, device=device)
        self.draft_counts = torch.zeros(self.batch_sizes[-1], dtype=torch.int32, device=device)
        # Host staging: [ids (0: the real rows' come from the device), positions, slot mapping,
        # cached, context] per row; [last, drafts] per request.
        self._rows_cpu = torch.zeros(5, n, dtype=torch.int64).pin_memory()
        self._seqs_cpu = torch.zeros(2, self.batch_sizes[-1], dtype=torch.int64).pin_memory()
        self._tables_cpu = torch.zeros(n, max_blocks_per_seq, dtype=torch.int32).pin_memory()
        self._rows_np, self._seqs_np = self._rows_cpu.numpy(), self._seqs_cpu.numpy()
        self._tables_np = self._tables_cpu.numpy()
        # drafts [bucket, k] int64 per bucket; the staging guard
        self.buckets = GraphBuckets(self.batch_sizes, stream, what="MTP head graph for batch size")
        self._tails: dict[int, torch.Tensor] = {}  # [bucket, hidden], rewritten by each replay

    def capture(self) -> None:
        self.buckets.capture(self._forward)

    def bucket_for(self, num_seqs: int) -> int | None:
        return self.buckets.bucket_for(num_seqs)

    def run(
        self,
        bucket: int,
        rows: Sequence[tuple[int, Sequence[int], int]],
        block_tables: Sequence[Sequence[int]],
        num_drafts: Sequence[int],
        hidden: torch.Tensor,
        next_ids: torch.Tensor,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Replay the bucket's graph -> (drafts [n, k] int64, tails' head outputs [n, hidden]),
        both valid until the next replay.

        rows[i] = (number, rotary positions, first cache index) of request i's pending rows (1
        to k + 1 of them); hidden and next_ids (on the device, possibly still being computed on
        the graphs' stream): every request's pending target rows and the token after each, in
        order.
        """
        w, bs = self.rows_per_seq, self.block_size
        self.buckets.wait_for_staging()
        r, s, t = self._rows_np, self._seqs_np, self._tables_np
        num_rows = bucket * w
        r[:, :num_rows] = 0
        r[2, :num_rows] = -1  # padding rows write no KV and read no context
        s[:, :bucket] = 0
        s[0, :bucket] = np.arange(bucket) * w
        dst: list[int] = []
        for i, ((n, positions, start), table) in enumerate(zip(rows, block_tables, strict=True)):
            assert 1 <= n <= w, f"{n} pending rows; a head graph takes 1 to {w}"
            row = i * w
            idx = np.arange(start, start + n)
            blocks = np.asarray(table, dtype=np.int64)[idx // bs]
            r[1, row : row + n] = positions
            r[2, row : row + n] = blocks * bs + idx % bs
            r[3, row : row + n] = idx
            r[4, row : row + n] = idx + 1
            t[row : row + n, : len(table)] = table
            s[0, i] = row + n - 1
            s[1, i] = num_drafts[i]
            dst += range(row, row + n)
        n_seqs = len(rows)
        with torch.cuda.stream(self.stream):
            device = self.stream.device
            dev = self._rows_cpu[:, :num_rows].to(device, non_blocking=True)
            seqs = self._seqs_cpu[:, :bucket].to(device, non_blocking=True)
            self.input_ids[:num_rows].copy_(dev[0])  # padding rows embed id 0
            self.positions[:num_rows].copy_(dev[1])
            self.slot_mapping[:num_rows].copy_(dev[2])
            self.cached_lens[:num_rows].copy_(dev[3])
            self.context_lens[:num_rows].copy_(dev[4])
            self.block_tables[:num_rows].copy_(self._tables_cpu[:num_rows], non_blocking=True)
            self.last[:bucket].copy_(seqs[0])
            self.draft_counts[:bucket].copy_(seqs[1])
            index = torch.tensor(dst, dtype=torch.int64).pin_memory().to(device, non_blocking=True)
            self.hidden.index_copy_(0, index, hidden)
            self.input_ids.index_copy_(0, index, next_ids)
            drafts = self.buckets.replay(bucket)
            return drafts[:n_seqs], self._tails[bucket][:n_seqs]

    def _forward(self, size: int) -> torch.Tensor:
        """The graph's work for `size` requests (the buffers' addresses are the graph's)."""
        num_rows = size * self.rows_per_seq
        batch = self._rows_batch(num_rows, self.last[:size])
        ids = self.input_ids[:num_rows]
        out = self.head(self.model.embed_input_ids(ids), self.hidden[:num_rows], batch)
        last = self.last[:size]
        hidden = out[last]
        self._tails[size] = hidden
        drafts = [self.draft_logits(hidden).argmax(dim=-1)]
        step_batch = ForwardBatch(
            positions=batch.positions[last],
            cu_seqlens=self.cu_seqlens[: size + 1],
            cached_lens=batch.cached_lens[last],
            context_lens=batch.context_lens[last],
            block_tables=batch.block_tables[last],
            slot_mapping=batch.slot_mapping[last],
            state_slots=self.state_slots[:size],
            logits_indices=self.last[:size],
            is_decode=True,
            caches=self.caches,
            cu_seqlens_cpu=list(range(size + 1)),
            cached_lens_cpu=[1] * size,
        )
        counts = self.draft_counts[:size]
        for step in range(1, self.num_drafts):
            step_batch = advance_draft_batch(step_batch, counts > step, block_size=self.block_size)
            hidden = self.head(self.model.embed_input_ids(drafts[-1]), hidden, step_batch)
            drafts.append(self.draft_logits(hidden).argmax(dim=-1))
        return torch.stack(drafts, dim=1)


def advance_draft_batch(
    batch: ForwardBatch, active: torch.Tensor | None, *, block_size: int, by: int = 1
) -> ForwardBatch:
    """The next draft step's batch (one row per request) from the one before, on the device:
    each row where `active` (None: every row) moves `by` positions on; the others stay and
    write no KV."""
    inc = batch.cached_lens.new_full(batch.cached_lens.shape, by)
    if active is not None:
        inc = inc * active
    cached = batch.cached_lens + inc
    idx = (cached // block_size).long().clamp_(max=batch.block_tables.shape[1] - 1)
    blocks = batch.block_tables.gather(1, idx[:, None])[:, 0].long()
    slots = blocks * block_size + (cached % block_size).long()
    if active is not None:
        slots = torch.where(active, slots, -1)
    return replace(
        batch,
        positions=batch.positions + inc.long(),
        cached_lens=cached,
        context_lens=batch.context_lens + inc,
        slot_mapping=slots,
    )
