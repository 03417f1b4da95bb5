"""Static row buffers of the graphs whose every row runs as a decode row of its own: the decode,
verify and MTP-head graphs (`graphs.decode`, `graphs.verify`, `graphs.head`)."""

from __future__ import annotations

import torch
from sparkinfer.model.cache_spec import ModelCaches
from sparkinfer.model.forward_batch import ForwardBatch
from sparkinfer.scheduler._inflight import StepInFlight, merge_inflight_inputs


class DecodeRowBuffers:
    """Allocates the per-row buffers a graph reads and builds its batch over the first rows."""

    caches: ModelCaches

    def _allocate_rows(
        self, num_rows: int, max_blocks_per_seq: int, device: torch.device, *, state_slot_fill: int
    ) -> None:
        """Buffers for up to num_rows rows: ids, positions, KV slots (-1: write none), cached
        and context lengths, state slots, block tables and the one-row-per-sequence offsets."""

        def buf(*shape: int, dtype: torch.dtype, fill: int = 0) -> torch.Tensor:
            return torch.full(shape, fill, dtype=dtype, device=device)

        n = num_rows
        self.input_ids = buf(n, dtype=torch.int64)
        self.positions = buf(n, dtype=torch.int64)
        self.slot_mapping = buf(n, dtype=torch.int64, fill=-1)
        self.cached_lens = buf(n, dtype=torch.int32)
        self.context_lens = buf(n, dtype=torch.int32)
        self.state_slots = buf(n, dtype=torch.int64, fill=state_slot_fill)
        self.block_tables = buf(n, max_blocks_per_seq, dtype=torch.int32)
        self.cu_seqlens = torch.arange(n + 1, dtype=torch.int32, device=device)

    def _copy_staged_rows(
        self,
        rows_cpu: torch.Tensor,
        tables_cpu: torch.Tensor,
        num_rows: int,
        inflight: StepInFlight | None,
    ) -> torch.Tensor:
        """Copy the first num_rows staged rows into the static buffers on the current stream
        -> the staged rows on the device (a family's rows past the seventh: its own).

        rows_cpu: pinned [7 or more, n] int64: ids, positions, KV slots, cached and context
        lengths, state slots and each row's source row in `inflight` (ids still on the device).
        tables_cpu: pinned [n, max_blocks_per_seq] int32 block tables."""
        dev = rows_cpu[:, :num_rows].to(self.input_ids.device, non_blocking=True)
        self.input_ids[:num_rows].copy_(merge_inflight_inputs(dev[0], dev[6], inflight))
        self.positions[:num_rows].copy_(dev[1])
        self.slot_mapping[:num_rows].copy_(dev[2])
        self.cached_lens[:num_rows].copy_(dev[3])
        self.context_lens[:num_rows].copy_(dev[4])
        self.state_slots[:num_rows].copy_(dev[5])
        self.block_tables[:num_rows].copy_(tables_cpu[:num_rows], non_blocking=True)
        return dev

    def _rows_batch(self, num_rows: int, logits_indices: torch.Tensor) -> ForwardBatch:
        """Views of the first num_rows rows' buffers (the graph reads these addresses), each
        row a decode row continuing from its own state (kernels read the device tensors)."""
        return ForwardBatch(
            positions=self.positions[:num_rows],
            cu_seqlens=self.cu_seqlens[: num_rows + 1],
            cached_lens=self.cached_lens[:num_rows],
            context_lens=self.context_lens[:num_rows],
            block_tables=self.block_tables[:num_rows],
            slot_mapping=self.slot_mapping[:num_rows],
            state_slots=self.state_slots[:num_rows],
            logits_indices=logits_indices,
            is_decode=True,
            caches=self.caches,
            cu_seqlens_cpu=list(range(num_rows + 1)),
            cached_lens_cpu=[1] * num_rows,
        )
