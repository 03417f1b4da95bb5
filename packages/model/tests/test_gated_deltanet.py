"""The Gated-DeltaNet layer's speculative verify and commit (CPU references): every verify row has
the bits of a one-token decode step at its position, the verify leaves the states, and the
commit leaves the states of the kept positions' decode steps, bit for bit."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from sparkinfer.model.cache_spec import ModelCaches, allocate_caches
from sparkinfer.model.decoder import Qwen3_8ForCausalLM
from sparkinfer.model.forward_batch import ForwardBatch, VerifyLayout
from sparkinfer.model.layers.gated_deltanet import GatedDeltaNet
from sparkinfer.model.weights import load_model

NUM_POSITIONS = [3, 3, 2, 1]  # sequences, position-major rows: 4 + 3 + 2 = 9
SLOTS = [2, 0, 4, 3]
NUM_KEPT = [3, 1, 2, 1]


@pytest.fixture(scope="module")
def model(causal_ckpt: Path) -> Qwen3_8ForCausalLM:
    return load_model(causal_ckpt, device="cpu", dtype=torch.float32, progress=False)


def _layout() -> tuple[torch.Tensor, list[tuple[int, int]]]:
    """seq_rows [B, T] and each row's (sequence, position)."""
    T = max(NUM_POSITIONS)
    seq_rows = torch.full((len(NUM_POSITIONS), T), -1, dtype=torch.int64)
    rows: list[tuple[int, int]] = []
    for j in range(T):
        for i, n in enumerate(NUM_POSITIONS):
            if j < n:
                seq_rows[i, j] = len(rows)
                rows.append((i, j))
    return seq_rows, rows


def _caches(model: Qwen3_8ForCausalLM, num_verify_rows: int = 0) -> ModelCaches:
    caches = allocate_caches(
        model.cache_spec(), num_blocks=2, block_size=16, num_slots=5, device="cpu",
        num_verify_rows=num_verify_rows,
    )  # fmt: skip
    gen = torch.Generator().manual_seed(1)
    for c in caches.linear.values():
        c.conv.copy_(torch.randn(c.conv.shape, generator=gen))
        c.recurrent.copy_(torch.randn(c.recurrent.shape, generator=gen) * 0.1)
    return caches


def _batch(caches: ModelCaches, slots: list[int]) -> ForwardBatch:
    """A decode batch of one row per entry of slots (-1: the row is skipped)."""
    n = len(slots)
    return ForwardBatch.build(
        [1] * n, [1] * n, [[1]] * n, slots, caches=caches, block_size=16, device="cpu"
    )


def _gdn(model: Qwen3_8ForCausalLM) -> GatedDeltaNet:
    layer = next(layer for layer in model.model.layers if layer.is_linear)
    gdn = layer.linear_attn
    assert isinstance(gdn, GatedDeltaNet)
    return gdn


def _decode_positions(gdn, caches, x, rows, keep) -> torch.Tensor:
    """One decode step per position over all rows (the same GEMM shapes), rows not at that
    position (or not kept) skipped: -> each row's output at its own position."""
    out = torch.full((x.shape[0], x.shape[1]), float("nan"))
    for j in range(max(NUM_POSITIONS)):
        slots = [SLOTS[i] if p == j and keep(i, p) else -1 for i, p in rows]
        y = gdn(x, _batch(caches, slots))
        at = [r for r, s in enumerate(slots) if s >= 0]
        out[at] = y[at]
    return out


def _states(caches: ModelCaches) -> list[torch.Tensor]:
    return [t.clone() for c in caches.linear.values() for t in (c.conv, c.recurrent)]


def test_verify_rows_are_decode_steps_and_commit_keeps_the_accepted_ones(model):
    gdn = _gdn(model)
    seq_rows, rows = _layout()
    x = torch.randn(len(rows), model.config.text.hidden_size, generator=torch.Generator())
    # A stash of exactly the verify's rows: the CPU references' gates and norms over the stash
    # then take the decode steps' tensor lengths (torch's vector loops round a tail their own
    # way; the engine's deterministic mode and the Triton kernels are row-invariant anyway).
    caches = _caches(model, num_verify_rows=len(rows))
    before = _states(caches)
    batch = _batch(caches, [SLOTS[i] for i, _ in rows])
    batch.verify = VerifyLayout(seq_rows, torch.tensor(SLOTS))
    with torch.inference_mode():
        y = gdn(x, batch)
        assert all(torch.equal(a, b) for a, b in zip(_states(caches), before, strict=True))
        decoded = _decode_positions(gdn, _caches(model), x, rows, lambda i, p: True)
        # Within rounding on the CPU: packed rows and one-row steps are products of other shapes
        # here; the bits are the GPU kernel tests' (test_gated_delta_rule_verify).
        torch.testing.assert_close(y, decoded, rtol=1e-5, atol=1e-6)
        model.commit_verify(caches, batch.verify, torch.tensor(NUM_KEPT))
        kept = _caches(model)
        _decode_positions(gdn, kept, x, rows, lambda i, p: p < NUM_KEPT[i])
    layer = gdn.layer_idx
    torch.testing.assert_close(caches.linear[layer].conv, kept.linear[layer].conv)
    torch.testing.assert_close(caches.linear[layer].recurrent, kept.linear[layer].recurrent)


def test_a_verify_without_a_stash_says_how_to_get_one(model):
    seq_rows, rows = _layout()
    caches = _caches(model)
    batch = _batch(caches, [SLOTS[i] for i, _ in rows])
    batch.verify = VerifyLayout(seq_rows, torch.tensor(SLOTS))
    x = torch.randn(len(rows), model.config.text.hidden_size)
    with torch.inference_mode(), pytest.raises(ValueError, match="num_verify_rows"):
        _gdn(model)(x, batch)
