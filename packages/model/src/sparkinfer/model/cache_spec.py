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

    def verify_bytes_per_row(self) -> int:
        """The `VerifyStash` of one verified row: pre- and post-conv inputs, two gate inputs."""
        return (2 * self.conv_dim + 2 * self.num_v_heads) * self.conv_dtype.itemsize


@dataclass(frozen=True)
class CacheSpec:
    """Everything the stack caches: one entry per attention layer and per Gated-DeltaNet layer."""

    attention: tuple[AttentionCacheSpec, ...]
    linear: tuple[LinearStateSpec, ...]

    def kv_bytes_per_token(self) -> int:
        return sum(s.bytes_per_token() for s in self.attention)

    def state_bytes_per_slot(self) -> int:
        return sum(s.bytes_per_slot() for s in self.linear)

    def verify_bytes_per_row(self) -> int:
        """The verify stashes of one verified row over every Gated-DeltaNet layer."""
        return sum(s.verify_bytes_per_row() for s in self.linear)


@dataclass
class AttentionCache:
    """Paged KV of one layer. k, v: [num_blocks, block_size, num_kv_heads, head_dim]."""

    k: torch.Tensor
    v: torch.Tensor

    @property
    def block_size(self) -> int:
        return self.k.shape[1]


@dataclass
class VerifyStash:
    """What a speculative verify step's rows fed one GDN layer, kept until the commit applies
    the accepted ones to the state (the verify leaves the state as it was), by verify row:

    conv_in: [num_rows, conv_dim] pre-conv [q | k | v] (the conv window's new inputs).
    conv_out: [num_rows, conv_dim] post-conv [q | k | v] (the recurrent update's k and v).
    gates: [num_rows, 2 * num_v_heads] raw gate inputs [b | a] (write strength, decay), in the
        in_proj's column order, so one copy stashes both; `b` and `a` are its halves.
    All in the model dtype. At 27B (conv_dim 10240, 48 value heads, bf16) that is 41,152 bytes
    per row and layer, 1.98 MB per row over the 48 GDN layers: 7.9 MB per sequence verifying 3
    drafts, against 151 MB of state per copied roll-back point.
    """

    conv_in: torch.Tensor
    conv_out: torch.Tensor
    gates: torch.Tensor

    @property
    def b(self) -> torch.Tensor:
        """[num_rows, num_v_heads] raw write strength (a view of `gates`)."""
        return self.gates[:, : self.gates.shape[1] // 2]

    @property
    def a(self) -> torch.Tensor:
        """[num_rows, num_v_heads] raw decay input (a view of `gates`)."""
        return self.gates[:, self.gates.shape[1] // 2 :]


@dataclass
class LinearStateCache:
    """State pool of one GDN layer, one row per slot.

    conv: [num_slots, conv_len, conv_dim] in the model dtype (oldest input first).
    recurrent: [num_slots, num_v_heads, v_head_dim, k_head_dim] fp32: each head's S (K x V in
        transformers) stored transposed, so a decode program's block of V rows is contiguous.
    verify: the speculative verify's stash (None where no step verifies drafts).
    """

    conv: torch.Tensor
    recurrent: torch.Tensor
    verify: VerifyStash | None = None


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
    num_verify_rows: int = 0,
) -> ModelCaches:
    """Allocate zeroed caches: `num_blocks` KV pages per attention layer, `num_slots` state rows,
    and a `VerifyStash` of `num_verify_rows` rows per GDN layer where that is not 0."""

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
            verify=_verify_stash(s, num_verify_rows, device) if num_verify_rows else None,
        )
        for s in spec.linear
    }
    return ModelCaches(attention=attention, linear=linear)


def _verify_stash(s: LinearStateSpec, num_rows: int, device: torch.device | str) -> VerifyStash:
    def rows(width: int) -> torch.Tensor:
        return torch.zeros(num_rows, width, dtype=s.conv_dtype, device=device)

    return VerifyStash(rows(s.conv_dim), rows(s.conv_dim), rows(2 * s.num_v_heads))
