"""ForwardBatch.build: offsets, positions, slot mapping through block tables, phase detection."""

from __future__ import annotations

import pytest
import torch
from sparkinfer.model.cache_spec import ModelCaches
from sparkinfer.model.forward_batch import ForwardBatch

NO_CACHES = ModelCaches(attention={}, linear={})


def build(new, cached, tables, slots, **kw) -> ForwardBatch:
    return ForwardBatch.build(
        new, cached, tables, slots, caches=NO_CACHES, block_size=4, device="cpu", **kw
    )


def test_prefill_with_chunk_continuation() -> None:
    batch = build([3, 2], [0, 5], [[7], [2, 9]], [1, 0])
    assert batch.cu_seqlens.tolist() == [0, 3, 5] and batch.cu_seqlens.dtype == torch.int32
    assert batch.positions.tolist() == [0, 1, 2, 5, 6]
    # sequence 1 continues at position 5: block 9 (table index 1), offsets 1 and 2
    assert batch.slot_mapping.tolist() == [28, 29, 30, 37, 38]
    assert batch.context_lens.tolist() == [3, 7]
    assert batch.block_tables.tolist() == [[7, 0], [2, 9]]
    assert batch.logits_indices.tolist() == [2, 4]
    assert batch.state_slots.tolist() == [1, 0]
    assert not batch.is_decode
    assert batch.has_initial_state == [False, True]
    assert (batch.num_seqs, batch.num_tokens, batch.max_query_len) == (2, 5, 3)


def test_device_state_mask_and_index_cache_belong_to_one_batch() -> None:
    batch = build([3, 2], [0, 5], [[7], [2, 9]], [1, 0])
    mask = batch.has_initial_state_mask
    assert mask.tolist() == [False, True] and mask.device == batch.cached_lens.device
    assert batch.has_initial_state_mask is mask  # computed once for all layers
    other = build([3, 2], [0, 5], [[7], [2, 9]], [1, 0])
    assert batch.index_cache == {} and other.index_cache is not batch.index_cache


def test_decode_needs_one_token_after_a_cache() -> None:
    assert build([1, 1], [4, 9], [[1, 2], [3, 4, 5]], [0, 1]).is_decode
    # a one-token prompt starts from zero state: it is a prefill
    assert not build([1, 1], [4, 0], [[1, 2], [3]], [0, 1]).is_decode


def test_explicit_mrope_positions_and_logits_rows() -> None:
    positions = torch.tensor([[0, 1, 1], [0, 1, 2], [0, 2, 1]])
    batch = build([3], [0], [[0]], [0], positions=positions, logits_indices=[0, 2])
    assert batch.positions is positions
    assert batch.logits_indices.tolist() == [0, 2]


def test_rejects_mismatched_lists_and_short_block_tables() -> None:
    with pytest.raises(ValueError, match="per-sequence lists differ in length"):
        build([1, 2], [0], [[0]], [0])
    with pytest.raises(ValueError, match="needs 6 KV rows; its block table has 1 blocks of 4"):
        build([2], [4], [[3]], [0])


def test_positions_and_slots_match_a_per_token_walk_of_the_tables() -> None:
    gen = torch.Generator().manual_seed(3)
    new = [int(n) for n in torch.randint(0, 40, (9,), generator=gen)]
    cached = [int(c) for c in torch.randint(0, 30, (9,), generator=gen)]
    tables = [torch.randperm(64, generator=gen)[: -(-(c + n) // 4)].tolist()
              for c, n in zip(cached, new, strict=True)]  # fmt: skip
    batch = build(new, cached, tables, list(range(9)))
    positions = [p for c, n in zip(cached, new, strict=True) for p in range(c, c + n)]
    slots = [t[p // 4] * 4 + p % 4 for c, n, t in zip(cached, new, tables, strict=True)
             for p in range(c, c + n)]  # fmt: skip
    assert batch.positions.tolist() == positions
    assert batch.slot_mapping.tolist() == slots and batch.slot_mapping.dtype == torch.int64
    empty = build([], [], [], [])
    assert empty.positions.tolist() == [] and empty.block_tables.shape == (0, 0)
