"""Decode under CUDA graphs: one graph per batch-size bucket, captured once, replayed every step.

Every per-request index lives in a static device buffer sized for the largest bucket. A step
copies its rows in (input ids taken on the device from the step in flight where the host does
not know them yet; from pinned host buffers, refilled only once the last copy out of them is
done), pads the bucket with rows that touch nothing
(state slot -1, context length 0, KV slot -1) and replays. Graphs are never rebuilt; a batch
larger than the largest bucket runs eagerly. The buffers are filled on the caller's stream, so
`capture` orders the graph stream after it before the first forward reads them.

Each graph also leaves its rows' final hidden states in a buffer of its pool (`hidden`, no
extra kernel: the forward's own output), so a drafter that reads them (MTP) replays the graphs
for its plain decode steps too. With `use_taps` (a block drafter) the graph runs the model's
tapped forward (`forward_tapped`: the same pass) and leaves the tap layers' rows beside them
(`tapped`).

Each run is one "decode_replay" span of the runner's `StepObserver`, when it has one.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from sparkinfer.model.cache_spec import ModelCaches
from sparkinfer.model.forward_batch import ForwardBatch
from sparkinfer.scheduler._causal_lm import CausalLM, forward_tapped
from sparkinfer.scheduler._inflight import (
    StepInFlight,
    device_source_rows,
)
from sparkinfer.scheduler.batch import ScheduledSeq
from sparkinfer.scheduler.graphs.buckets import GraphBuckets
from sparkinfer.scheduler.graphs.decode_rows import DecodeRowBuffers
from sparkinfer.scheduler.observer import StepObserver, observed


class DecodeGraphs(DecodeRowBuffers):
    """Owns the static decode buffers and one captured graph per bucket (runner-internal)."""

    def __init__(
        self,
        model: CausalLM,
        caches: ModelCaches,
        *,
        batch_sizes: Sequence[int],
        max_blocks_per_seq: int,
        block_size: int,
        stream: torch.cuda.Stream,
        use_taps: bool = False,
        observer: StepObserver | None = None,
    ) -> None:
        self.model = model
        self.observer = observer  # brackets each run (development tools; None: nothing)
        self.caches = caches
        self.block_size = block_size
        self.use_taps = use_taps
        self.batch_sizes = tuple(sorted(batch_sizes))
        self.max_batch = self.batch_sizes[-1]
        self.stream = stream
        device = stream.device
        n = self.max_batch
        self._allocate_rows(n, max_blocks_per_seq, device, state_slot_fill=-1)
        self.logits_indices = torch.arange(n, dtype=torch.int64, device=device)
        # Host staging: [ids, positions, slot mapping, cached, context, state slot, in-flight
        # source row] per row.
        self._rows_cpu = torch.zeros(7, n, dtype=torch.int64).pin_memory()
        self._tables_cpu = torch.zeros(n, max_blocks_per_seq, dtype=torch.int32).pin_memory()
        # Filled through numpy views: a torch op per element costs microseconds of host time.
        self._rows_np = self._rows_cpu.numpy()
        self._tables_np = self._tables_cpu.numpy()
        # logits [bucket, vocab] fp32 per bucket; the staging guard (`buckets`)
        self.buckets = GraphBuckets(self.batch_sizes, stream, what="decode graph for batch size")
        self._hidden: dict[int, torch.Tensor] = {}  # [bucket, hidden], rewritten by each replay
        self._tapped: dict[int, torch.Tensor] = {}  # [bucket, taps * hidden] with use_taps

    def capture(self) -> None:
        """Capture every bucket, largest first so the smaller ones reuse its memory pool."""
        self.buckets.capture(lambda size: self._forward(self._forward_batch(size)))

    def bucket_for(self, num_seqs: int) -> int | None:
        """The smallest captured batch size holding `num_seqs` rows (None: run eagerly)."""
        return self.buckets.bucket_for(num_seqs)

    def run(
        self,
        seqs: Sequence[ScheduledSeq],
        bucket: int,
        sources: Sequence[int | None],
        inflight: StepInFlight | None,
    ) -> torch.Tensor:
        """Replay the bucket's graph for these decode rows -> logits [len(seqs), vocab] fp32.

        sources[i]: the row of `inflight` whose sample (still on the device) is row i's input;
        None where the input is known.
        """
        with observed(self.observer, "decode_replay", self.stream):
            # A row per sampled token, each input a generated token at position n + rope_delta.
            assert all(s.is_decode for s in seqs), (
                "only decode rows replay (ScheduledSeq.is_decode)"
            )
            self.buckets.wait_for_staging()
            rows, tables = self._rows_np, self._tables_np
            rows[:, :bucket] = 0
            rows[2, :bucket] = -1  # padding rows write no KV
            rows[5, :bucket] = -1  # and touch no state slot
            rows[6, :bucket] = -1  # and feed known tokens
            rows[6, : len(seqs)] = device_source_rows(sources)
            for i, seq in enumerate(seqs):
                pos = seq.num_cached_tokens
                table = seq.req.block_ids
                rows[0, i] = 0 if seq.is_input_inflight else seq.req.token_ids[pos]
                rows[1, i] = pos + seq.req.rope_delta  # after an image, positions run behind
                rows[2, i] = table[pos // self.block_size] * self.block_size + pos % self.block_size
                rows[3, i] = pos
                rows[4, i] = pos + 1
                assert seq.req.state_slot is not None, (
                    f"{seq.req.request_id} runs without a state slot"
                )
                rows[5, i] = seq.req.state_slot
                tables[i, : len(table)] = table
            with torch.cuda.stream(self.stream):
                self._copy_staged_rows(self._rows_cpu, self._tables_cpu, bucket, inflight)
                return self.buckets.replay(bucket)[: len(seqs)]

    def hidden(self, bucket: int, num_rows: int) -> torch.Tensor:
        """The final hidden states [num_rows, hidden] of the bucket's last replay (valid until
        it replays again)."""
        return self._hidden[bucket][:num_rows]

    def tapped(self, bucket: int, num_rows: int) -> torch.Tensor:
        """The tap layers' rows [num_rows, taps * hidden] of the bucket's last replay (graphs
        captured `use_taps`; valid until it replays again)."""
        return self._tapped[bucket][:num_rows]

    def _forward_batch(self, size: int) -> ForwardBatch:
        """Views of the static buffers for `size` rows (the graph reads these addresses)."""
        return self._rows_batch(size, self.logits_indices[:size])

    def _forward(self, batch: ForwardBatch) -> torch.Tensor:
        size = batch.num_seqs
        if self.use_taps:
            hidden, self._tapped[size] = forward_tapped(self.model, self.input_ids[:size], batch)
        else:
            hidden = self.model(self.input_ids[:size], batch)
        self._hidden[size] = hidden  # the captured call's is the graph's: its pool keeps it
        return self.model.compute_logits(hidden)
