"""Verify steps under CUDA graphs: one graph per batch-size bucket, each row with k drafts, and
the commit of the accepted positions in a small graph per bucket.

A graph's layout is fixed: bucket b, k = num_speculative_tokens, rows position-major (row
j * b + i is position j of sequence i). A step's sequences fill the first rows; a sequence with
fewer than k drafts runs its missing positions too (input 0, no KV written, no context read),
which its state never commits; padding sequences have no state slot (-1: the GDN kernels skip
them). The verify writes no state, so its graph replays any number of times; after acceptance
(on the device) `commit` replays the bucket's commit graph (two kernels per GDN layer over the
bucket's `VerifyLayout`), which applies each sequence's kept positions to its slot. Drafts
still on the device feed their rows' input ids there (`Drafts.merge_into`). The verify graph
returns every row's final hidden state; the lm_head runs on the rows that count after the
replay (so the MTP drafter gets them too); with `use_taps` (a block drafter) it runs the tapped
forward and leaves every row's tap layers' states beside them (`tapped`). Buffers are filled as
in `graphs.decode`.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from sparkinfer.model.cache_spec import ModelCaches
from sparkinfer.model.forward_batch import ForwardBatch, VerifyLayout
from sparkinfer.scheduler._causal_lm import CausalLM, forward_tapped
from sparkinfer.scheduler._inflight import StepInFlight
from sparkinfer.scheduler.batch import ScheduledSeq
from sparkinfer.scheduler.graphs.buckets import GraphBuckets
from sparkinfer.scheduler.graphs.decode_rows import DecodeRowBuffers
from sparkinfer.scheduler.speculative.drafter import Drafts


class VerifyGraphs(DecodeRowBuffers):
    """Owns the static verify buffers and one captured graph per bucket (runner-internal)."""

    def __init__(
        self,
        model: CausalLM,
        caches: ModelCaches,
        *,
        batch_sizes: Sequence[int],
        num_drafts: int,
        max_rows: int,
        max_blocks_per_seq: int,
        block_size: int,
        stream: torch.cuda.Stream,
        use_taps: bool = False,
    ) -> None:
        self.model = model
        self.caches = caches
        self.block_size = block_size
        self.num_drafts = num_drafts
        self.use_taps = use_taps
        self._tapped: dict[int, torch.Tensor] = {}  # [rows, taps * hidden] per bucket
        # The caches' verify stashes hold max_rows rows: the largest bucket fills them.
        fits = [b for b in batch_sizes if b * (num_drafts + 1) <= max_rows]
        self.batch_sizes = tuple(sorted(fits))
        if not self.batch_sizes:
            raise ValueError(
                f"no verify graph fits the caches' {max_rows} verify rows at {num_drafts + 1} "
                "rows a sequence: raise max_num_batched_tokens or lower num_speculative_tokens"
            )
        self.stream = stream
        device = stream.device
        n = self.batch_sizes[-1] * (num_drafts + 1)
        self._allocate_rows(n, max_blocks_per_seq, device, state_slot_fill=-1)
        self.logits_indices = torch.arange(n, dtype=torch.int64, device=device)
        # [ids, positions, slot mapping, cached, context, state slot, in-flight source, draft
        # feed (`Drafts.feed_index`)] per row
        self._rows_cpu = torch.zeros(8, n, dtype=torch.int64).pin_memory()
        self._tables_cpu = torch.zeros(n, max_blocks_per_seq, dtype=torch.int32).pin_memory()
        self._rows_np = self._rows_cpu.numpy()
        self._tables_np = self._tables_cpu.numpy()
        # [bucket, k + 1]: sequence i's row at position j; its state slot is row i's
        positions = torch.arange(num_drafts + 1, dtype=torch.int64, device=device)
        self._seq_rows = {
            b: positions[None, :] * b + torch.arange(b, dtype=torch.int64, device=device)[:, None]
            for b in self.batch_sizes
        }
        # hidden [bucket * (k + 1), hidden] per bucket; the staging guard
        self.buckets = GraphBuckets(self.batch_sizes, stream, what="verify graph for batch size")
        # The commit's graphs: each sequence's kept positions, computed on the device.
        max_bucket = self.batch_sizes[-1]
        self.num_kept = torch.zeros(max_bucket, dtype=torch.int64, device=device)
        self.commits = GraphBuckets(
            self.batch_sizes, stream, what="verify commit graph for batch size"
        )

    def layout(self, bucket: int) -> VerifyLayout:
        """The bucket's rows as the model sees them (views of the static buffers)."""
        return VerifyLayout(self._seq_rows[bucket], self.state_slots[:bucket])

    def commit(self, bucket: int, num_kept: torch.Tensor) -> None:
        """After acceptance: apply each sequence's first num_kept[i] positions (num_kept
        [bucket] int64 on the device; padding sequences: 0) of the last replay to the state in
        its slot (the bucket's commit graph)."""
        with torch.cuda.stream(self.stream):
            self.num_kept[:bucket].copy_(num_kept)
            self.commits.replay(bucket)

    def capture(self) -> None:
        self.buckets.capture(
            lambda size: self._forward(self._forward_batch(size)), prepare=self._prepare_padding
        )
        self.commits.capture(self._commit_forward, prepare=self._prepare_commit)

    def bucket_for(self, num_seqs: int) -> int | None:
        return self.buckets.bucket_for(num_seqs)

    def tapped(self, bucket: int) -> torch.Tensor:
        """The tap layers' states [bucket * (k + 1), taps * hidden] of the bucket's last replay,
        rows as `run`'s (graphs captured `use_taps`; valid until it replays again)."""
        return self._tapped[bucket]

    def graph_row(self, bucket: int, position: int, rank: int) -> int:
        return position * bucket + rank

    def run(
        self,
        seqs: Sequence[ScheduledSeq],
        drafts: Drafts,
        bucket: int,
        sources: Sequence[int | None],
        inflight: StepInFlight | None,
    ) -> torch.Tensor:
        """Replay the bucket's graph for these decode rows and drafts -> hidden
        [bucket * (k + 1), hidden] (row `graph_row(bucket, j, i)`: position j of seqs[i]).
        Drafts still on the device feed the input ids there (`Drafts.merge_into`)."""
        self.buckets.wait_for_staging()
        self._fill(seqs, drafts, bucket, sources)
        num_rows = bucket * (self.num_drafts + 1)
        with torch.cuda.stream(self.stream):
            dev = self._copy_staged_rows(self._rows_cpu, self._tables_cpu, num_rows, inflight)
            if drafts.is_on_device:
                ids = self.input_ids[:num_rows]
                ids.copy_(drafts.merge_into(ids, dev[7]))
            return self.buckets.replay(bucket)

    def _fill(
        self,
        seqs: Sequence[ScheduledSeq],
        drafts: Drafts,
        bucket: int,
        sources: Sequence[int | None],
    ) -> None:
        rows, tables = self._rows_np, self._tables_np
        self._pad_rows(bucket)
        bs = self.block_size
        host = None if drafts.is_on_device else drafts.host()
        for i, (seq, count) in enumerate(zip(seqs, drafts.counts, strict=True)):
            table = seq.req.block_ids
            assert seq.req.state_slot is not None, f"{seq.req.request_id} runs without a slot"
            for j in range(self.num_drafts + 1):
                r = self.graph_row(bucket, j, i)
                pos = seq.num_cached_tokens + j
                is_real = j <= count
                if j == 0:
                    rows[0, r] = 0 if seq.is_input_inflight else seq.req.token_ids[pos]
                    source = sources[i]
                    rows[6, r] = -1 if source is None else source
                elif host is not None:
                    rows[0, r] = host[i][j - 1] if is_real else 0
                else:  # the id comes from the device (0 here)
                    rows[7, r] = drafts.feed_index(i, j - 1)
                rows[1, r] = pos + seq.req.rope_delta
                rows[2, r] = table[pos // bs] * bs + pos % bs if is_real else -1
                rows[3, r] = pos
                rows[4, r] = pos + 1 if is_real else 0
                rows[5, r] = seq.req.state_slot
                tables[r, : len(table)] = table

    def _pad_rows(self, bucket: int) -> None:
        """Every row of the bucket as padding: no KV, no context, no state slot."""
        rows = self._rows_np
        num_rows = bucket * (self.num_drafts + 1)
        rows[:, :num_rows] = 0
        rows[2, :num_rows] = -1
        rows[5, :num_rows] = -1
        rows[6, :num_rows] = -1
        rows[7, :num_rows] = -1

    def _prepare_padding(self, size: int) -> None:
        """Padding rows in the buffers before a capture's warm-up forward (on the graph stream,
        which the warm-up runs on)."""
        self._pad_rows(size)
        num_rows = size * (self.num_drafts + 1)
        with torch.cuda.stream(self.stream):
            self.state_slots[:num_rows].copy_(self._rows_cpu[5, :num_rows])
            self.slot_mapping[:num_rows].fill_(-1)
            self.context_lens[:num_rows].zero_()

    def _forward_batch(self, size: int) -> ForwardBatch:
        num_rows = size * (self.num_drafts + 1)
        batch = self._rows_batch(num_rows, self.logits_indices[:num_rows])
        batch.verify = self.layout(size)
        return batch

    def _prepare_commit(self, size: int) -> None:
        """Padding rows, nothing kept: the warm-up before a commit's capture changes no state."""
        self._prepare_padding(size)
        with torch.cuda.stream(self.stream):
            self.num_kept.zero_()

    def _commit_forward(self, size: int) -> torch.Tensor:
        self.model.commit_verify(self.caches, self.layout(size), self.num_kept[:size])
        return self.num_kept[:size]

    def _forward(self, batch: ForwardBatch) -> torch.Tensor:
        ids = self.input_ids[: batch.num_seqs]
        if not self.use_taps:
            return self.model(ids, batch)
        hidden, tapped = forward_tapped(self.model, ids, batch)
        self._tapped[batch.num_seqs // (self.num_drafts + 1)] = tapped  # its pool keeps it
        return hidden
