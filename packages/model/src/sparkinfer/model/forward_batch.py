"""Per-step metadata: which new tokens of which sequences run, and where their caches live.

A step packs B sequences into one flat run of T new tokens. Sequence b owns rows
cu_seqlens[b]:cu_seqlens[b+1] of every [T, ...] tensor, starts at absolute position cached_lens[b]
and ends the step with context_lens[b] = cached_lens[b] + its new tokens in the cache.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from sparkinfer.model.cache_spec import ModelCaches


@dataclass
class ForwardBatch:
    """Metadata for one forward over a packed batch (built by the engine's runner).

    positions:      [T] int64 text positions, or [3, T] MRoPE (t, h, w) positions
    cu_seqlens:     [B+1] int32 offsets of each sequence's new tokens in the flat batch
    cached_lens:    [B] int32 tokens already cached before this step
    context_lens:   [B] int32 cached + new tokens after this step
    block_tables:   [B, max_blocks] int32 KV pages of each sequence (unused entries are 0)
    slot_mapping:   [T] int64 flat KV row (page * block_size + offset) for each new token
    state_slots:    [B] int64 state-pool row of each sequence; -1 marks a padding row (graphs)
    logits_indices: [N] int64 rows of the flat batch whose logits are wanted
    is_decode:      every sequence has exactly one new token (recurrent kernels, no chunking)
    caches:         the cache views of every layer
    cu_seqlens_cpu / cached_lens_cpu: host copies for shapes and python-side loops
    """

    positions: torch.Tensor
    cu_seqlens: torch.Tensor
    cached_lens: torch.Tensor
    context_lens: torch.Tensor
    block_tables: torch.Tensor
    slot_mapping: torch.Tensor
    state_slots: torch.Tensor
    logits_indices: torch.Tensor
    is_decode: bool
    caches: ModelCaches
    cu_seqlens_cpu: list[int]
    cached_lens_cpu: list[int]

    @property
    def num_seqs(self) -> int:
        return len(self.cu_seqlens_cpu) - 1

    @property
    def num_tokens(self) -> int:
        return self.cu_seqlens_cpu[-1]

    @property
    def max_query_len(self) -> int:
        c = self.cu_seqlens_cpu
        return max((c[i + 1] - c[i] for i in range(len(c) - 1)), default=0)

    @property
    def has_initial_state(self) -> list[bool]:
        """Whether each sequence continues from cached state (False: start from zero state)."""
        return [n > 0 for n in self.cached_lens_cpu]
