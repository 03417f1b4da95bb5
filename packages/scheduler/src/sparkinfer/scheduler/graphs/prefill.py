"""Short prompt-chunk forwards under CUDA graphs: one graph per token bucket, captured once.

Launching an eager forward of the 27B model takes the host about 55 ms (some 1,100 kernels),
more than the device needs for a step of a few hundred tokens, so a short prompt, the last
chunk of a long one or a prefix-cache hit waited on the host. A step's prompt chunks (its decode
rows run in a forward of their own) of at most `max_seqs` sequences and at most a bucket's tokens
replay that bucket's graph instead. The graph ends with the hidden rows of the sampled tokens;
the lm_head runs after the replay on just the sampled rows, so no graph holds a [rows, vocab]
logits buffer of its own.

The graph always runs `max_seqs + 1` sequences over the bucket's tokens: the step's own, then one
padding sequence that takes the rest of the tokens, then empty ones. Padding writes no KV (KV
slot -1), touches no state (state slot -1, zero length or zero output) and is never read (its
rows are only ever followed by row-wise ops, and no logits row points at them). Every per-step
index lives in a static device buffer filled from pinned host buffers, as `graphs.decode` does for
decode. Steps with media or MRoPE positions, prompt logprobs, or more tokens or sequences than
the graphs hold run eagerly.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch
from sparkinfer.model.cache_spec import ModelCaches
from sparkinfer.model.forward_batch import ForwardBatch
from sparkinfer.scheduler._causal_lm import CausalLM
from sparkinfer.scheduler._inflight import (
    StepInFlight,
    device_source_rows,
    merge_inflight_inputs,
)
from sparkinfer.scheduler.batch import ScheduledSeq
from sparkinfer.scheduler.graphs.buckets import GraphBuckets


class PrefillGraphs:
    """Owns the static prefill buffers and one captured graph per token bucket (runner-internal)."""

    def __init__(
        self,
        model: CausalLM,
        caches: ModelCaches,
        *,
        token_sizes: Sequence[int],
        max_seqs: int,
        max_blocks_per_seq: int,
        block_size: int,
        stream: torch.cuda.Stream,
    ) -> None:
        self.model = model
        self.caches = caches
        self.block_size = block_size
        self.token_sizes = tuple(sorted(token_sizes))
        self.max_seqs = max_seqs
        self.stream = stream
        device = stream.device
        n, s = self.token_sizes[-1], max_seqs + 1  # tokens; sequences with the padding one

        def buf(*shape: int, dtype: torch.dtype, fill: int = 0) -> torch.Tensor:
            return torch.full(shape, fill, dtype=dtype, device=device)

        self.input_ids = buf(n, dtype=torch.int64)
        self.positions = buf(n, dtype=torch.int64)
        self.slot_mapping = buf(n, dtype=torch.int64, fill=-1)
        self.cu_seqlens = buf(s + 1, dtype=torch.int32)
        self.cached_lens = buf(s, dtype=torch.int32)
        self.context_lens = buf(s, dtype=torch.int32)
        self.state_slots = buf(s, dtype=torch.int64, fill=-1)
        self.block_tables = buf(s, max_blocks_per_seq, dtype=torch.int32)
        self.logits_indices = buf(min(max_seqs, n), dtype=torch.int64)
        # Host staging, filled through numpy views: token rows [ids, positions, KV slot, in-flight
        # source row]; sequence rows [cu_seqlens, cached, context, state slot]; logits rows.
        self._tokens_cpu = torch.zeros(4, n, dtype=torch.int64).pin_memory()
        self._seqs_cpu = torch.zeros(4, s + 1, dtype=torch.int64).pin_memory()
        self._logits_cpu = torch.zeros(self.logits_indices.shape[0], dtype=torch.int64).pin_memory()
        self._tables_cpu = torch.zeros(s, max_blocks_per_seq, dtype=torch.int32).pin_memory()
        self._tokens_np, self._seqs_np = self._tokens_cpu.numpy(), self._seqs_cpu.numpy()
        self._logits_np, self._tables_np = self._logits_cpu.numpy(), self._tables_cpu.numpy()
        # Block-table rows past _table_rows are zero on the host and the device alike, so a step
        # rewrites and copies only the rows it or the step before used (a full table is 1 MiB at
        # 65 sequences and max_model_len 262,144).
        self._table_rows = 0
        self._table_rows_to_copy = 0
        # hidden [min(max_seqs, bucket), hidden] of the rows to sample, per bucket; the guard
        # of the staging buffers, recorded after the copies out of them
        self.buckets = GraphBuckets(self.token_sizes, stream, what="prefill graph for tokens")

    def capture(self) -> None:
        """Capture every bucket, largest first so the smaller ones reuse its memory pool; each is
        captured over an all-padding step (one sequence of all its tokens, no state)."""
        self.buckets.capture(
            lambda size: self._forward(self._forward_batch(size)),
            prepare=lambda size: self._load([], size, None),
        )

    def bucket_for(self, seqs: Sequence[ScheduledSeq]) -> int | None:
        """The smallest captured token count holding this step (None: run it eagerly)."""
        if len(seqs) > self.max_seqs or any(s.req.multimodal is not None for s in seqs):
            return None
        num_tokens = sum(s.num_new_tokens for s in seqs)
        return self.buckets.bucket_for(num_tokens)

    def run(
        self,
        seqs: Sequence[ScheduledSeq],
        bucket: int,
        sources: Sequence[int | None],
        inflight: StepInFlight | None,
    ) -> torch.Tensor:
        """Replay the bucket's graph for this step -> logits [sampled seqs, vocab] fp32.

        sources[i]: the row of `inflight` whose sample (still on the device) is seqs[i]'s one
        input token; None where the inputs are known.
        """
        num_sampled = self._load(seqs, bucket, inflight, sources)
        with torch.cuda.stream(self.stream):
            captured = self.buckets.captured[bucket]
            captured.graph.replay()  # its staging guard was recorded behind the copies (_load)
            return self.model.compute_logits(captured.output[:num_sampled])

    def _load(
        self,
        seqs: Sequence[ScheduledSeq],
        bucket: int,
        inflight: StepInFlight | None,
        sources: Sequence[int | None] = (),
    ) -> int:
        """Fill the static buffers for this step on the graph stream; returns the number of
        sampled sequences."""
        self.buckets.wait_for_staging()
        num_sampled = self._fill(seqs, bucket, device_source_rows(sources))
        s = self.max_seqs + 1
        with torch.cuda.stream(self.stream):
            dev = self._tokens_cpu[:, :bucket].to(self.stream.device, non_blocking=True)
            self.input_ids[:bucket].copy_(merge_inflight_inputs(dev[0], dev[3], inflight))
            self.positions[:bucket].copy_(dev[1])
            self.slot_mapping[:bucket].copy_(dev[2])
            seq_rows = self._seqs_cpu.to(self.stream.device, non_blocking=True)
            self.cu_seqlens.copy_(seq_rows[0])
            self.cached_lens.copy_(seq_rows[1, :s])
            self.context_lens.copy_(seq_rows[2, :s])
            self.state_slots.copy_(seq_rows[3, :s])
            rows = self._table_rows_to_copy
            self.block_tables[:rows].copy_(self._tables_cpu[:rows], non_blocking=True)
            self.logits_indices.copy_(self._logits_cpu, non_blocking=True)
            self.buckets.mark_staging_read()
        return num_sampled

    def _fill(self, seqs: Sequence[ScheduledSeq], bucket: int, sources: list[int]) -> int:
        """Write the step's rows, padded to `bucket` tokens and max_seqs + 1 sequences, into the
        staging buffers; returns the number of sampled sequences."""
        tokens, seq_rows, tables = self._tokens_np, self._seqs_np, self._tables_np
        tokens[:, :bucket] = 0
        tokens[2:, :bucket] = -1  # padding tokens write no KV and feed known ids
        seq_rows[:] = 0
        seq_rows[3] = -1  # padding sequences touch no state slot
        self._table_rows_to_copy = max(self._table_rows, len(seqs))
        tables[: self._table_rows_to_copy] = 0
        self._table_rows = len(seqs)
        self._logits_np[:] = 0
        start, num_sampled = 0, 0
        for i, seq in enumerate(seqs):
            n, cached = seq.num_new_tokens, seq.num_cached_tokens
            end = start + n
            pos = np.arange(cached, cached + n, dtype=np.int64)
            table = seq.req.block_ids
            tokens[0, start:end] = [0] if seq.is_input_inflight else seq.new_token_ids
            tokens[1, start:end] = pos + seq.req.rope_delta
            tokens[2, start:end] = (
                np.asarray(table, dtype=np.int64)[pos // self.block_size] * self.block_size
                + pos % self.block_size
            )
            tokens[3, start:end] = sources[i]
            assert seq.req.state_slot is not None, f"{seq.req.request_id} runs without a state slot"
            seq_rows[:, i] = (start, cached, cached + n, seq.req.state_slot)
            tables[i, : len(table)] = table
            if seq.is_sampled:
                self._logits_np[num_sampled] = end - 1
                num_sampled += 1
            start = end
        # The padding sequence takes the bucket's remaining tokens; the empty ones follow it.
        seq_rows[0, len(seqs)] = start
        seq_rows[0, len(seqs) + 1 :] = bucket
        seq_rows[2, len(seqs)] = bucket - start
        return num_sampled

    def _forward_batch(self, size: int) -> ForwardBatch:
        """Views of the static buffers for a `size`-token step (the graph reads these addresses)."""
        s = self.max_seqs + 1
        return ForwardBatch(
            positions=self.positions[:size],
            cu_seqlens=self.cu_seqlens,
            cached_lens=self.cached_lens,
            context_lens=self.context_lens,
            block_tables=self.block_tables,
            slot_mapping=self.slot_mapping[:size],
            state_slots=self.state_slots,
            logits_indices=self.logits_indices[: min(self.max_seqs, size)],
            is_decode=False,
            caches=self.caches,
            cu_seqlens_cpu=[0] * s + [size],  # shapes only: kernels read the device buffers
            cached_lens_cpu=[0] * s,
        )

    def _forward(self, batch: ForwardBatch) -> torch.Tensor:
        """The forward of a `size`-token step -> hidden rows [logits rows, hidden]."""
        size = batch.slot_mapping.shape[0]
        return self.model(self.input_ids[:size], batch, logits_rows_only=True)
