"""The MTP head's catch-up over kept rows under CUDA graphs: one graph per token bucket.

A catch-up runs the head over runs of target rows, a run per request (a prompt chunk's every row,
or the rows a request kept while it did not draft: `speculative.mtp_drafter`), row p paired with
the token after it, its KV at cache index p. Eagerly that is some forty launches of host time
(about 4.5 ms at 27B width for a 1,024-token prompt, in a step the host launches while the
device runs it), so a catch-up of at most `max_seqs` runs and a bucket's rows replays the
bucket's graph instead: the head over `max_seqs + 1` sequences, the runs first, then one padding
sequence over the rest of the bucket's rows, then empty ones (as `graphs.prefill` lays out a
step). Padding rows write no KV (slot -1) and are never read; the head keeps no recurrent state
(every state slot -1). The rows' hidden states and next tokens are copied in on the device; the
head's output rows stay in the graph's pool until it replays again.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch
from sparkinfer.model.cache_spec import ModelCaches
from sparkinfer.model.forward_batch import ForwardBatch
from sparkinfer.model.mtp import MTPHead
from sparkinfer.scheduler._causal_lm import CausalLM
from sparkinfer.scheduler.graphs.buckets import GraphBuckets


class HeadCatchUpGraphs:
    """Owns the catch-up's static buffers and one captured graph per token bucket
    (drafter-internal)."""

    def __init__(
        self,
        model: CausalLM,
        head: MTPHead,
        caches: ModelCaches,
        *,
        token_sizes: Sequence[int],
        max_seqs: int,
        max_blocks_per_seq: int,
        block_size: int,
        hidden_size: int,
        dtype: torch.dtype,
        stream: torch.cuda.Stream,
    ) -> None:
        self.model = model
        self.head = head
        self.caches = caches
        self.block_size = block_size
        self.token_sizes = tuple(sorted(token_sizes))
        self.max_seqs = max_seqs
        self.stream = stream
        device = stream.device
        n, s = self.token_sizes[-1], max_seqs + 1  # rows; sequences with the padding one

        def buf(*shape: int, dtype: torch.dtype, fill: int = 0) -> torch.Tensor:
            return torch.full(shape, fill, dtype=dtype, device=device)

        self.input_ids = buf(n, dtype=torch.int64)
        self.hidden = torch.zeros(n, hidden_size, dtype=dtype, device=device)
        self.positions = buf(n, dtype=torch.int64)
        self.slot_mapping = buf(n, dtype=torch.int64, fill=-1)
        self.cu_seqlens = buf(s + 1, dtype=torch.int32)
        self.cached_lens = buf(s, dtype=torch.int32)
        self.context_lens = buf(s, dtype=torch.int32)
        self.state_slots = buf(s, dtype=torch.int64, fill=-1)  # no recurrent state
        self.block_tables = buf(s, max_blocks_per_seq, dtype=torch.int32)
        self.logits_indices = buf(s, dtype=torch.int64)  # unread: the head computes no logits
        # Host staging, filled through numpy views: row [positions, KV slot]; sequence
        # [cu_seqlens, cached, context].
        self._rows_cpu = torch.zeros(2, n, dtype=torch.int64).pin_memory()
        self._seqs_cpu = torch.zeros(3, s + 1, dtype=torch.int64).pin_memory()
        self._tables_cpu = torch.zeros(s, max_blocks_per_seq, dtype=torch.int32).pin_memory()
        self._rows_np, self._seqs_np = self._rows_cpu.numpy(), self._seqs_cpu.numpy()
        self._tables_np = self._tables_cpu.numpy()
        # Block-table rows past _table_rows are zero on the host and the device alike, so a
        # catch-up rewrites and copies only the rows it or the one before used.
        self._table_rows = 0
        self._table_rows_to_copy = 0
        # the head's output [bucket, hidden] per bucket; the staging guard
        self.buckets = GraphBuckets(
            self.token_sizes, stream, what="MTP head catch-up graph for rows"
        )

    def capture(self) -> None:
        """Capture every bucket, largest first (the smaller ones reuse its memory pool), each
        over all-padding rows."""
        self.buckets.capture(self._forward, prepare=lambda size: self._load([], size))

    def bucket_for(self, counts: Sequence[int]) -> int | None:
        """The smallest captured row count holding runs of these many rows (None: eager)."""
        if len(counts) > self.max_seqs:
            return None
        return self.buckets.bucket_for(sum(counts))

    def run(
        self,
        bucket: int,
        runs: Sequence[tuple[int, int, Sequence[int]]],
        positions: np.ndarray,
        hidden: torch.Tensor,
        next_ids: torch.Tensor,
    ) -> torch.Tensor:
        """Replay the bucket's graph -> the head's output rows [rows, hidden] (valid until the
        next replay).

        runs[i] = (first cache index, rows, block table) of request i's run; positions: every
        row's rotary position, in order; hidden [rows, hidden] and next_ids [rows] (on the
        device): every row's target hidden state and the token after it, in order.
        """
        num_rows = int(hidden.shape[0])
        self._load(runs, bucket, positions)
        with torch.cuda.stream(self.stream):
            self.hidden[:num_rows].copy_(hidden)
            self.input_ids[:num_rows].copy_(next_ids)
            return self.buckets.replay(bucket)[:num_rows]

    def _load(
        self,
        runs: Sequence[tuple[int, int, Sequence[int]]],
        bucket: int,
        positions: np.ndarray | None = None,
    ) -> None:
        """Fill the static index buffers for these runs on the graph stream."""
        self.buckets.wait_for_staging()
        self._fill(runs, bucket, positions)
        s = self.max_seqs + 1
        with torch.cuda.stream(self.stream):
            dev = self._rows_cpu[:, :bucket].to(self.stream.device, non_blocking=True)
            self.positions[:bucket].copy_(dev[0])
            self.slot_mapping[:bucket].copy_(dev[1])
            seq_rows = self._seqs_cpu.to(self.stream.device, non_blocking=True)
            self.cu_seqlens.copy_(seq_rows[0])
            self.cached_lens.copy_(seq_rows[1, :s])
            self.context_lens.copy_(seq_rows[2, :s])
            rows = self._table_rows_to_copy
            self.block_tables[:rows].copy_(self._tables_cpu[:rows], non_blocking=True)
            self.buckets.mark_staging_read()

    def _fill(
        self,
        runs: Sequence[tuple[int, int, Sequence[int]]],
        bucket: int,
        positions: np.ndarray | None,
    ) -> None:
        """Write the runs' rows, padded to `bucket` rows and max_seqs + 1 sequences, into the
        staging buffers."""
        rows, seq_rows, tables = self._rows_np, self._seqs_np, self._tables_np
        bs = self.block_size
        rows[0, :bucket] = 0
        rows[1, :bucket] = -1  # padding rows write no KV
        seq_rows[:] = 0
        self._table_rows_to_copy = max(self._table_rows, len(runs))
        tables[: self._table_rows_to_copy] = 0
        self._table_rows = len(runs)
        start = 0
        for i, (first, n, table) in enumerate(runs):
            end = start + n
            idx = np.arange(first, first + n, dtype=np.int64)
            blocks = np.asarray(table, dtype=np.int64)[idx // bs]
            rows[1, start:end] = blocks * bs + idx % bs
            seq_rows[:, i] = (start, first, first + n)
            tables[i, : len(table)] = table
            start = end
        if positions is not None:
            rows[0, :start] = positions
        # The padding sequence takes the bucket's remaining rows; the empty ones follow it.
        seq_rows[0, len(runs)] = start
        seq_rows[0, len(runs) + 1 :] = bucket
        seq_rows[2, len(runs)] = bucket - start

    def _forward(self, size: int) -> torch.Tensor:
        """The head over `size` rows (the buffers' addresses are the graph's)."""
        s = self.max_seqs + 1
        batch = ForwardBatch(
            positions=self.positions[:size],
            cu_seqlens=self.cu_seqlens,
            cached_lens=self.cached_lens,
            context_lens=self.context_lens,
            block_tables=self.block_tables,
            slot_mapping=self.slot_mapping[:size],
            state_slots=self.state_slots,
            logits_indices=self.logits_indices,
            is_decode=False,
            caches=self.caches,
            cu_seqlens_cpu=[0] * s + [size],  # shapes only: kernels read the device buffers
            cached_lens_cpu=[0] * s,
        )
        embeds = self.model.embed_input_ids(self.input_ids[:size])
        return self.head(embeds, self.hidden[:size], batch)
