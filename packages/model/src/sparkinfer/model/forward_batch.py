"""Per-step metadata: which new tokens of which sequences run, and where their caches live.

A step packs B sequences into one flat run of T new tokens. Sequence b owns rows
cu_seqlens[b]:cu_seqlens[b+1] of every [T, ...] tensor, starts at absolute position cached_lens[b]
and ends the step with context_lens[b] = cached_lens[b] + its new tokens in the cache.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
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
    index_cache:    the prefill kernels' index tables derived from cu_seqlens (chunk and tile
                    maps): the first layer that needs one builds it here and every later layer of
                    the step reuses it (valid while cu_seqlens is not rewritten in place)
    verify:         set on a speculative verify step (`VerifyLayout`): each row is one position
                    of a sequence's input token and drafts, as a decode row of its own
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
    index_cache: dict[str, tuple[torch.Tensor, ...]] = field(
        default_factory=dict, init=False, repr=False, compare=False
    )
    verify: VerifyLayout | None = None

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

    @functools.cached_property
    def has_initial_state_mask(self) -> torch.Tensor:
        """[B] bool on the device: cached_lens > 0, computed once per batch for every GDN layer."""
        return self.cached_lens > 0

    @classmethod
    def build(
        cls,
        num_new_tokens: Sequence[int],
        cached_lens: Sequence[int],
        block_tables: Sequence[Sequence[int]],
        state_slots: Sequence[int],
        *,
        caches: ModelCaches,
        block_size: int,
        device: torch.device | str,
        positions: torch.Tensor | None = None,
        logits_indices: Sequence[int] | None = None,
    ) -> ForwardBatch:
        """Build the batch of one step from per-sequence host lists.

        Sequence b runs num_new_tokens[b] tokens after cached_lens[b] cached ones, its KV in the
        blocks block_tables[b] (enough for cached + new tokens) and its GDN state in row
        state_slots[b]. Positions default to the text positions cached..cached+new-1 ([T]); pass
        [3, T] MRoPE positions for multimodal prompts. Logits default to each sequence's last token.
        The step is a decode step when every sequence has one new token after a non-empty cache.
        """
        num_seqs = len(num_new_tokens)
        if not num_seqs == len(cached_lens) == len(block_tables) == len(state_slots):
            raise ValueError(
                f"per-sequence lists differ in length: num_new_tokens {num_seqs}, cached_lens "
                f"{len(cached_lens)}, block_tables {len(block_tables)}, state_slots "
                f"{len(state_slots)}: give one entry per sequence"
            )
        for new, cached, table in zip(num_new_tokens, cached_lens, block_tables, strict=True):
            if cached + new > len(table) * block_size:
                raise ValueError(
                    f"a sequence needs {cached + new} KV rows; its block table has {len(table)} "
                    f"blocks of {block_size}: allocate more blocks"
                )
        # Per-token positions and KV rows, vectorised: a long prompt's chunk is thousands of rows.
        new_np = np.asarray(num_new_tokens, dtype=np.int64).reshape(num_seqs)
        cu_np = np.zeros(num_seqs + 1, dtype=np.int64)
        np.cumsum(new_np, out=cu_np[1:])
        max_blocks = max((len(t) for t in block_tables), default=0)
        tables = np.zeros((num_seqs, max_blocks), dtype=np.int64)
        for i, t in enumerate(block_tables):
            tables[i, : len(t)] = t
        seq_of_token = np.repeat(np.arange(num_seqs), new_np)
        text_positions = (
            np.arange(int(cu_np[-1]), dtype=np.int64)
            - cu_np[:-1][seq_of_token]
            + np.asarray(cached_lens, dtype=np.int64).reshape(num_seqs)[seq_of_token]
        )
        blocks = tables[seq_of_token, text_positions // block_size]
        slots = blocks * block_size + text_positions % block_size
        cu = cu_np.tolist()
        context = [c + n for c, n in zip(cached_lens, num_new_tokens, strict=True)]
        last = [c - 1 for c in cu[1:]] if logits_indices is None else list(logits_indices)

        def ints(values: Sequence[int] | np.ndarray, dtype: torch.dtype) -> torch.Tensor:
            if isinstance(values, np.ndarray):
                return host_to_device(torch.as_tensor(values).to(dtype), device)
            return host_to_device(torch.tensor(values, dtype=dtype), device)

        return cls(
            positions=ints(text_positions, torch.int64) if positions is None else positions,
            cu_seqlens=ints(cu, torch.int32),
            cached_lens=ints(cached_lens, torch.int32),
            context_lens=ints(context, torch.int32),
            block_tables=ints(tables, torch.int32).reshape(num_seqs, max_blocks),
            slot_mapping=ints(slots, torch.int64),
            state_slots=ints(state_slots, torch.int64),
            logits_indices=ints(last, torch.int64),
            is_decode=all(n == 1 for n in num_new_tokens) and all(c > 0 for c in cached_lens),
            caches=caches,
            cu_seqlens_cpu=cu,
            cached_lens_cpu=list(cached_lens),
        )


@dataclass(frozen=True)
class VerifyLayout:
    """A verify step's rows: row `seq_rows[i, j]` is position j of sequence i (its input token at
    j = 0, its j-th draft after; -1 past its last position), each a decode row of its own
    (attention reads each row's own context length).

    A Gated-DeltaNet layer runs each sequence's positions one after the other from the state in
    its slot `seq_slots[i]` (-1: a padding sequence), so row j sees the state after the rows
    before it, exactly as j one-token steps would, and leaves the slot's state as it was; what
    the rows fed it stays in the layer's `VerifyStash` until `commit_verify` applies the accepted
    positions. seq_rows: [B, T] int64, seq_slots: [B] int64.
    """

    seq_rows: torch.Tensor
    seq_slots: torch.Tensor


def host_to_device(t: torch.Tensor, device: torch.device | str) -> torch.Tensor:
    """A host tensor on `device` without waiting for the stream.

    torch.tensor(..., device=cuda) and a blocking copy wait for the work queued before them, so
    the host would stop running ahead of the step in flight; the copy goes from pinned memory,
    so it is truly asynchronous.
    """
    if torch.device(device).type != "cuda":
        return t.to(device)
    return t.pin_memory().to(device, non_blocking=True)
