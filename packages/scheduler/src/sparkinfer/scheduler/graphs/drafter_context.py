"""A block drafter's context writes under CUDA graphs: one graph per rows bucket.

Every decode step hands the drafter its accepted positions (a few per request), whose K/V each
drafter layer writes into its cache (`BlockDrafter.write_context_rows`): about a hundred small
kernels whose launches cost the host far more than their work costs the device. Each rows bucket
(powers of two up to the largest) is captured up front into one memory pool; a step's tapped
rows, positions and cache rows are copied into static buffers and the bucket's graph replays.
The rows past a step's own are padding: position 0, written to `dump_row`, a cache row that no
proposal reads. A step of more rows (prompt chunks) writes eagerly.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch
from sparkinfer.model.drafters.cache import DrafterCache
from sparkinfer.model.drafters.dflash import BlockDrafter
from sparkinfer.scheduler.graphs.buckets import GraphBuckets


def context_row_sizes(max_rows: int) -> tuple[int, ...]:
    """The rows buckets: powers of two from 1 to the first at least max_rows."""
    return tuple(1 << i for i in range(max(1, max_rows - 1).bit_length() + 1))


class DrafterContextGraphs:
    """Owns the context writes' static buffers and captured graphs (drafter-internal).

    Args:
        drafter, cache: the block drafter and its paged cache.
        max_rows: the most rows a graph writes.
        dump_row: the cache row padding rows write to (read by no proposal).
        stream: the stream the graphs are captured and replayed on (the runner's).
    """

    def __init__(
        self,
        drafter: BlockDrafter,
        cache: DrafterCache,
        *,
        max_rows: int,
        dump_row: int,
        stream: torch.cuda.Stream,
    ) -> None:
        self.drafter = drafter
        self.cache = cache
        self.stream = stream
        self.dump_row = dump_row
        sizes = context_row_sizes(max_rows)
        n, device = sizes[-1], stream.device
        width = drafter.config.num_taps * drafter.config.hidden_size
        self.tapped = torch.zeros(n, width, dtype=drafter.dtype, device=device)
        self.positions = torch.zeros(n, dtype=torch.int64, device=device)
        self.rows = torch.full((n,), dump_row, dtype=torch.int64, device=device)
        # Host staging: per row [position, cache row]
        self._staging = torch.zeros(n, 2, dtype=torch.int64).pin_memory()
        self._staging_np = self._staging.numpy()
        self._buckets = GraphBuckets(sizes, stream, what="block drafter context write for rows")
        stream.wait_stream(torch.cuda.current_stream(device))  # the buffers, filled there
        self._buckets.capture(self._forward, prepare=self._prepare_padding)

    def run(self, tapped: torch.Tensor, positions: Sequence[int], rows: np.ndarray) -> bool:
        """Write tapped [N, num_taps * hidden] at positions [N] (cache rows [N]) by a replay on
        the stream; False where no bucket holds N rows (write eagerly)."""
        num_rows = len(positions)
        bucket = self._buckets.bucket_for(num_rows)
        if bucket is None:
            return False
        self._buckets.wait_for_staging()
        staging = self._staging_np
        staging[:bucket, 0] = 0
        staging[:bucket, 1] = self.dump_row
        staging[:num_rows, 0] = positions
        staging[:num_rows, 1] = rows
        caller = torch.cuda.current_stream(self.stream.device)
        self.stream.wait_stream(caller)
        with torch.cuda.stream(self.stream):
            dev = self._staging[:bucket].to(self.stream.device, non_blocking=True)
            self.positions[:bucket].copy_(dev[:, 0])
            self.rows[:bucket].copy_(dev[:, 1])
            self.tapped[:num_rows].copy_(tapped)
            self._buckets.replay(bucket)
        caller.wait_stream(self.stream)
        return True

    def _prepare_padding(self, rows: int) -> None:
        """Every row a padding row before a warm-up and capture (the warm-up writes for real)."""
        with torch.cuda.stream(self.stream):
            self.positions.zero_()
            self.rows.fill_(self.dump_row)

    def _forward(self, rows: int) -> torch.Tensor:
        self.drafter.write_context_rows(
            self.tapped[:rows], self.positions[:rows], self.cache, rows=self.rows[:rows]
        )
        return self.rows[:rows]
