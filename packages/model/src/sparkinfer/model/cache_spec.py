"""What each layer needs cached, and the cache views the engine hands back to the model.

The model declares a `CacheSpec`; the engine's runner allocates one `ModelCaches` from it and passes
it to every forward inside the `ForwardBatch`. The model never allocates or frees cache memory.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class AttentionCacheSpec:
    """Paged KV cache of one full-attention layer."""

    layer_idx: int
    num_kv_heads: int
    head_dim: int
    dtype: torch.dtype

    def bytes_per_token(self) -> int:
        return 2 * self.num_kv_heads * self.head_dim * self.dtype.itemsize


@dataclass(frozen=True)
class LinearStateSpec:
    """Per-sequence state of one Gated-DeltaNet layer: conv window and fp32 recurrent state."""

    layer_idx: int
    conv_dim: int
    conv_len: int  # kernel size - 1 pre-conv inputs kept
    num_v_heads: int
    k_head_dim: int
    v_head_dim: int
    conv_dtype: torch.dtype
    state_dtype: torch.dtype

    def bytes_per_slot(self) -> int:
        conv = self.conv_len * self.conv_dim * self.conv_dtype.itemsize
        rec = self.num_v_heads * self.k_head_dim * self.v_head_dim * self.state_dtype.itemsize
        return conv + rec


@dataclass(frozen=True)
class CacheSpec:
    """Everything the stack caches: one entry per attention layer and per Gated-DeltaNet layer."""

    attention: tuple[AttentionCacheSpec, ...]
    linear: tuple[LinearStateSpec, ...]

    def kv_bytes_per_token(self) -> int:
        return sum(s.bytes_per_token() for s in self.attention)

    def state_bytes_per_slot(self) -> int:
        return sum(s.bytes_per_slot() for s in self.linear)


@dataclass
class AttentionCache:
    """Paged KV of one layer. k, v: [num_blocks, block_size, num_kv_heads, head_dim]."""

    k: torch.Tensor
    v: torch.Tensor

    @property
    def block_size(self) -> int:
        return self.k.shape[1]


@dataclass
class LinearStateCache:
    """State pool of one GDN layer, one row per slot.

    conv: [num_slots, conv_len, conv_dim] in the model dtype (oldest input first).
    recurrent: [num_slots, num_v_heads, v_head_dim, k_head_dim] fp32: each head's S (K x V in
        transformers) stored transposed, so a decode program's block of V rows is contiguous.
    """

    conv: torch.Tensor
    recurrent: torch.Tensor


@dataclass
class ModelCaches:
    """Cache views for every layer, keyed by layer index."""

    attention: dict[int, AttentionCache]
    linear: dict[int, LinearStateCache]


def allocate_caches(
    spec: CacheSpec,
    *,
    num_blocks: int,
    block_size: int,
    num_slots: int,
    device: torch.device | str,
) -> ModelCaches:
    """Allocate zeroed caches: `num_blocks` KV pages per attention layer, `num_slots` state rows."""

    def kv_shape(s: AttentionCacheSpec) -> tuple[int, ...]:
        return (num_blocks, block_size, s.num_kv_heads, s.head_dim)

    attention = {
        s.layer_idx: AttentionCache(
            k=torch.zeros(kv_shape(s), dtype=s.dtype, device=device),
            v=torch.zeros(kv_shape(s), dtype=s.dtype, device=device),
        )
        for s in spec.attention
    }
    linear = {
        s.layer_idx: LinearStateCache(
            conv=torch.zeros(num_slots, s.conv_len, s.conv_dim, dtype=s.conv_dtype, device=device),
            recurrent=torch.zeros(
                (num_slots, s.num_v_heads, s.v_head_dim, s.k_head_dim),
                dtype=s.state_dtype,
                device=device,
            ),
        )
        for s in spec.linear
    }
    return ModelCaches(attention=attention, linear=linear)
