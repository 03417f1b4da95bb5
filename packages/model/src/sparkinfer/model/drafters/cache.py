"""A block drafter's own KV cache: per layer, keys and values of the context it has seen.

Row `slot` of the cache belongs to one sequence; position p of it holds the drafter's K/V of the
target's tapped hidden states at token p. A block proposal writes its own rows' K/V at the
positions after the context (anchor_position ...) as scratch: the next `write_context` of the
accepted tokens overwrites them, so a rejection needs no explicit crop, and a row never reads a
position past its own block. The engine allocates it (`allocate_drafter_cache`) and owns it.
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
    """k, v: [num_layers, num_slots, max_len, KV, D]; max_len covers a sequence's context plus
    one block."""

    k: torch.Tensor
    v: torch.Tensor

    @property
    def max_len(self) -> int:
        return self.k.shape[2]


def allocate_drafter_cache(
    spec: DrafterCacheSpec, *, num_slots: int, max_len: int, device: torch.device | str
) -> DrafterCache:
    """Zeroed K/V for `num_slots` sequences of up to `max_len` positions (context + block)."""
    shape = (spec.num_layers, num_slots, max_len, spec.num_kv_heads, spec.head_dim)
    return DrafterCache(
        k=torch.zeros(shape, dtype=spec.dtype, device=device),
        v=torch.zeros(shape, dtype=spec.dtype, device=device),
    )
