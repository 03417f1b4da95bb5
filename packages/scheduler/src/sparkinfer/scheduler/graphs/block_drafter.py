"""A block drafter's proposal under CUDA graphs: one graph per rows bucket, or per (rows
bucket, keys bucket) where the attention gathers its keys.

The proposal's shapes are its rows (requests drafting, padded to a bucket of `row_sizes`) and,
where the drafter's attention gathers and masks its keys (pages under 16 positions), the
context positions each row reads (`num_keys`, already a bucket: `speculative.block_drafter.
key_bucket`). A paged attention (`BlockDrafter.reads_paged`: each row's length is read on the
device) has no keys shape: one graph per rows bucket serves every context up to `max_keys`,
all captured up front (`capture_all`), so no step pays a capture. Otherwise a keys bucket is
reached only as contexts grow, so a (rows, keys) graph is captured the first time a step needs
it. All share one memory pool; rows beyond the largest bucket, keys past `max_keys`, gathered
shapes of more than MAX_GRAPH_KEYS keys in all (rows x keys: the pool keeps the largest graph's
gathered keys for good) and paged ones of more rows than `paged_graph_rows` (the decode
kernel's split partials and the logits, likewise) run eagerly. A graph runs the drafter's
`propose` and `draft_tokens` and returns the draft tokens [rows, n].
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch
from sparkinfer.kernels.paged_attention.decode import DecodeConfig
from sparkinfer.model.drafters.cache import DrafterCache
from sparkinfer.model.drafters.dflash import BlockDrafter
from sparkinfer.scheduler.graphs.buckets import GraphBuckets

# Rows x keys of the largest graphed proposal: each layer gathers that many K and V rows (about
# 1 GB at 8 KV heads of 128 in bf16), which the graphs' pool then holds.
MAX_GRAPH_KEYS = 1 << 18
# A paged proposal's largest per-row activations in all rows of the largest graph it captures:
# the decode kernel's fp32 split partials (each block row's heads x its most splits x head_dim)
# and the fp32 logits (16 MB a row at the 27B drafter's shape), which the graphs' pool holds.
MAX_PAGED_GRAPH_BYTES = 1 << 30


def paged_graph_rows(drafter: BlockDrafter) -> int:
    """The most rows a paged proposal's graph holds (MAX_PAGED_GRAPH_BYTES)."""
    c = drafter.config
    head_dim = 1 << (c.head_dim - 1).bit_length()
    partials = c.num_attention_heads * DecodeConfig.MAX_SPLITS * (head_dim + 2)
    per_row = c.block_size * (partials + c.vocab_size) * 4
    return max(1, MAX_PAGED_GRAPH_BYTES // per_row)


class BlockDrafterGraphs:
    """Owns the drafter's static buffers and its captured graphs (drafter-internal).

    Args:
        drafter, cache: the block drafter and its paged cache.
        row_sizes: the rows buckets (each at most the rows that own scratch pages).
        max_keys: the largest keys bucket graphed (a multiple of the page size).
        pad_tables: [max(row_sizes), max_keys / page] int64 host tables of padding rows.
        stream: the stream the graphs are captured and replayed on (the runner's).
    """

    def __init__(
        self,
        drafter: BlockDrafter,
        cache: DrafterCache,
        *,
        row_sizes: Sequence[int],
        max_keys: int,
        pad_tables: torch.Tensor,
        stream: torch.cuda.Stream,
    ) -> None:
        self.drafter = drafter
        self.cache = cache
        self.row_sizes = tuple(sorted(row_sizes))
        self.max_keys = max_keys
        self.stream = stream
        n, width = pad_tables.shape
        assert n == self.row_sizes[-1] and width * cache.block_size == max_keys, "pad tables"
        device = stream.device
        self.anchor_ids = torch.zeros(n, dtype=torch.int64, device=device)
        self.anchor_positions = torch.zeros(n, dtype=torch.int64, device=device)
        self.block_tables = pad_tables.to(device)
        self._pad_tables_cpu = pad_tables
        self._pad_tables = pad_tables.numpy()
        # Host staging: per row [anchor id, anchor position, block table ...]
        self._staging = torch.zeros(n, 2 + width, dtype=torch.int64).pin_memory()
        self._staging_np = self._staging.numpy()
        self.is_paged = drafter.reads_paged(cache)  # one graph per rows bucket, any context
        self._pool = torch.cuda.graph_pool_handle()
        self._by_keys: dict[int, GraphBuckets] = {}  # keys bucket -> its rows buckets' graphs
        stream.wait_stream(torch.cuda.current_stream(device))  # the buffers, filled there

    def num_graphs(self) -> int:
        return sum(len(b.captured) for b in self._by_keys.values())

    def capture_all(self) -> None:
        """Capture every rows bucket's graph now (a paged attention's: they serve every
        context); raises as `run` does."""
        assert self.is_paged, "a gathered attention's graphs are captured per keys bucket"
        for rows in self.row_sizes:
            if rows <= paged_graph_rows(self.drafter):
                self._buckets(rows, self.max_keys)

    def run(
        self,
        anchors: Sequence[int],
        starts: Sequence[int],
        tables: Sequence[Sequence[int]],
        num_keys: int,
    ) -> torch.Tensor | None:
        """The draft tokens [len(anchors), n] of these rows (each table covering num_keys
        positions), replayed on the stream; None where no graph holds the shape (run eagerly).
        Captures the (rows, keys) graph first when this is its first step. A failed capture
        raises (`GraphCaptureError`, RuntimeError): the caller runs eagerly from then on."""
        num_rows = len(anchors)
        rows = next((b for b in self.row_sizes if b >= num_rows), None)
        if rows is None or num_keys > self.max_keys:
            return None
        if self.is_paged and rows > paged_graph_rows(self.drafter):
            return None
        if not self.is_paged and rows * num_keys > MAX_GRAPH_KEYS:
            return None
        buckets = self._buckets(rows, self.max_keys if self.is_paged else num_keys)
        buckets.wait_for_staging()
        width = -(-num_keys // self.cache.block_size)
        staging = self._staging_np
        staging[:rows, 0:2] = 0
        staging[:rows, 2:] = self._pad_tables[:rows]
        staging[:num_rows, 0] = anchors
        staging[:num_rows, 1] = starts
        staging[:num_rows, 2 : 2 + width] = np.asarray(tables, dtype=np.int64)
        caller = torch.cuda.current_stream(self.stream.device)
        self.stream.wait_stream(caller)
        with torch.cuda.stream(self.stream):
            dev = self._staging[:rows].to(self.stream.device, non_blocking=True)
            self.anchor_ids[:rows].copy_(dev[:, 0])
            self.anchor_positions[:rows].copy_(dev[:, 1])
            self.block_tables[:rows].copy_(dev[:, 2:])
            tokens = buckets.replay(rows)[:num_rows]
        caller.wait_stream(self.stream)
        return tokens

    def _buckets(self, rows: int, graph_keys: int) -> GraphBuckets:
        """The graphs over graph_keys keys, the rows bucket's captured first if it is not."""
        buckets = self._by_keys.get(graph_keys)
        if buckets is None:
            what = f"block drafter graph over {graph_keys} keys for rows"
            buckets = GraphBuckets(self.row_sizes, self.stream, what=what)
            self._by_keys[graph_keys] = buckets
        if rows not in buckets.captured:
            buckets.capture(
                lambda size: self._forward(size, graph_keys),
                prepare=self._prepare_padding,
                sizes=(rows,),
                pool=self._pool,
            )
        return buckets

    def _prepare_padding(self, rows: int) -> None:
        """Every row a padding row before a warm-up and capture: the warm-up runs for real, and
        a row left from an earlier step could point at pages another request owns now."""
        with torch.cuda.stream(self.stream):  # the warm-up's stream reads them
            self.anchor_ids.zero_()
            self.anchor_positions.zero_()
            self.block_tables.copy_(self._pad_tables_cpu)

    def _forward(self, rows: int, num_keys: int) -> torch.Tensor:
        width = -(-num_keys // self.cache.block_size)
        ids = self.anchor_ids[:rows]
        draft = self.drafter.propose(
            ids,
            self.anchor_positions[:rows],
            self.cache,
            block_tables=self.block_tables[:rows, :width],
            num_keys=num_keys,
        )
        return self.drafter.draft_tokens(draft, ids).tokens
