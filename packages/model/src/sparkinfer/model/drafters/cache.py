"""A block drafter's own KV cache, paged like the target's: per layer, K and V of the context.

Position p of a sequence lives in row `block_table[p // block_size] * block_size + p %
block_size` of each layer's [num_blocks * block_size, KV, D] table, so the drafter can share the
target's block tables (and its prefix cache: a position's drafter K/V depend only on the tokens
up to it). A block proposal writes its own rows' K/V at the positions after the context (anchor
.. anchor + block_size - 1) as scratch; the next `write_context` of the accepted tokens writes
over them, so a rejection needs no explicit crop, and a row never reads a position past its own
block. The engine allocates it (`allocate_drafter_cache`) and owns it.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class DrafterCacheSpec:
    """What the drafter caches per token: K and V of each of its layers."""

    num_layers: int
    num_kv_heads: int
    head_dim: int
    dtype: torch.dtype

    def bytes_per_token(self) -> int:
        itemsize = torch.empty((), dtype=self.dtype).element_size()
        return 2 * self.num_layers * self.num_kv_heads * self.head_dim * itemsize


@dataclass(frozen=True)
class DrafterCache:
    """k, v: [num_layers, num_blocks * block_size, KV, D], rows addressed by `cache_rows`."""

    k: torch.Tensor
    v: torch.Tensor
    block_size: int


def allocate_drafter_cache(
    spec: DrafterCacheSpec, *, num_blocks: int, block_size: int, device: torch.device | str
) -> DrafterCache:
    """Zeroed K/V for `num_blocks` pages of `block_size` positions."""
    shape = (spec.num_layers, num_blocks * block_size, spec.num_kv_heads, spec.head_dim)
    return DrafterCache(
        k=torch.zeros(shape, dtype=spec.dtype, device=device),
        v=torch.zeros(shape, dtype=spec.dtype, device=device),
        block_size=block_size,
    )


def cache_rows(
    block_tables: torch.Tensor, positions: torch.Tensor, block_size: int
) -> torch.Tensor:
    """The cache rows of positions [B, ...] of the B sequences whose pages block_tables [B, M]
    lists -> int64 [B, ...]. A position's page must be in its table (past the last one: an
    index error on the device)."""
    b = block_tables.shape[0]
    pages = block_tables.gather(1, (positions // block_size).reshape(b, -1)).view(positions.shape)
    return pages * block_size + positions % block_size
