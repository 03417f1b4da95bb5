"""Causal conv1d + SiLU: references against transformers, fast ops against references."""

import inspect

import pytest
import torch
import torch.nn.functional as F
from sparkinfer.kernels.causal_conv1d import (
    causal_conv1d,
    causal_conv1d_ref,
    causal_conv1d_update,
    causal_conv1d_update_ref,
    fused,
)
from transformers.models.qwen3_5 import modeling_qwen3_5 as hf

C, W = 24, 4
# At the default 16-token tile: blocks inside one sequence (one of them all padding) beside blocks
# that straddle a start, hold several sequences, shorter than W - 1 or empty, or end the batch.
MIXED_LENGTHS = [40, 2, 1, 0, 3, 37, 40, 5]
MIXED_SLOTS = [0, 1, 2, 3, -1, 4, -1, 5]
MIXED_INIT = [True, True, False, True, True, False, True, True]


def varlen(lengths: list[int], device: str = "cpu") -> torch.Tensor:
    """cu_seqlens [B + 1] int32 for the given sequence lengths."""
    cu = F.pad(torch.tensor(lengths, dtype=torch.int32).cumsum(0), (1, 0)).to(torch.int32)
    return cu.to(device)


def make_inputs(num_tokens: int, *, seed: int, dtype=torch.float32, channels=200, num_slots=8):
    """x [T, C], weight [C, W], conv_state [num_slots, W - 1, C]; C is not a tile multiple."""
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(num_tokens, channels, generator=gen).to(dtype)
    weight = torch.randn(channels, W, generator=gen).to(dtype)
    conv_state = torch.randn(num_slots, W - 1, channels, generator=gen).to(dtype)
    return x, weight, conv_state


def run_prefill(fn, x, weight, conv_state, lengths, slots, has_init):
    """fn (fast or reference) on a copy of the pool: returns (y, conv_state)."""
    state = conv_state.clone()
    y = fn(
        x, weight, state,
        cu_seqlens=varlen(lengths, x.device.type),
        state_slots=torch.tensor(slots, device=x.device),
        has_initial_state=torch.tensor(has_init, device=x.device),
    )  # fmt: skip
    return y, state


def strided(x: torch.Tensor) -> torch.Tensor:
    """The same values as a view with padded rows, as when x is a slice of a wider projection."""
    return F.pad(x, (0, 40))[:, : x.shape[1]]


@pytest.fixture
def tile(monkeypatch: pytest.MonkeyPatch):
    """tile(bt, bc) sets the prefill kernel's token and channel tile for the test."""

    def set_tile(bt: int, bc: int) -> None:
        monkeypatch.setattr(fused, "BT", bt)
        monkeypatch.setattr(fused, "BC", bc)

    return set_tile


def test_ref_matches_transformers_prefill_then_update():
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(9, C, generator=gen)
    weight = torch.randn(C, W, generator=gen)
    conv_state = torch.randn(2, W - 1, C, generator=gen)
    y = causal_conv1d_ref(
        x[:7], weight, conv_state,
        cu_seqlens=varlen([7]), state_slots=torch.tensor([1]),
        has_initial_state=torch.tensor([False]),
    )  # fmt: skip
    hf_y = hf.causal_conv1d_fn(x[:7].T[None], weight, activation="silu")[0].T
    torch.testing.assert_close(y, hf_y, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(conv_state[1], x[4:7])

    # HF's decode cache holds W columns, [1, C, W]; ours holds the last W - 1 as [W - 1, C].
    hf_state = torch.cat([x[3:4], x[4:7]]).T[None].contiguous()
    for t in (7, 8):
        y_t = causal_conv1d_update_ref(
            x[t : t + 1], weight, conv_state, state_slots=torch.tensor([1])
        )
        hf_y_t = hf.causal_conv1d_update(x[t][None, :, None], hf_state, weight, activation="silu")
        torch.testing.assert_close(y_t[0], hf_y_t[0, :, 0], atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(conv_state[1], hf_state[0, :, 1:].T)


def test_ref_short_sequence_keeps_older_window():
    gen = torch.Generator().manual_seed(1)
    x = torch.randn(2, C, generator=gen)
    weight = torch.randn(C, W, generator=gen)
    conv_state = torch.randn(1, W - 1, C, generator=gen)
    init = conv_state[0].clone()
    y = causal_conv1d_ref(
        x, weight, conv_state,
        cu_seqlens=varlen([2]), state_slots=torch.tensor([0]),
        has_initial_state=torch.tensor([True]),
    )  # fmt: skip
    full = hf.causal_conv1d_fn(torch.cat([init, x]).T[None], weight, activation="silu")[0].T
    torch.testing.assert_close(y, full[W - 1 :], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(conv_state[0], torch.cat([init[2:], x]))


@pytest.mark.parametrize(
    ("fast", "ref"),
    [(causal_conv1d, causal_conv1d_ref), (causal_conv1d_update, causal_conv1d_update_ref)],
)
def test_fast_op_signature_matches_ref(fast, ref):
    assert inspect.signature(fast) == inspect.signature(ref)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_causal_conv1d_varlen(dtype, assert_close, assert_same_bits):
    # Lengths around W - 1 = 3 and the token tile (16), an empty sequence, a padding row.
    lengths = [1, 2, 3, 4, 17, 0, 5]
    slots = [0, 1, 2, 3, 4, 5, -1]
    has_init = [True, True, False, True, False, True, True]
    x, weight, conv_state = make_inputs(sum(lengths), seed=1, dtype=dtype)
    args = (x, weight, conv_state, lengths, slots, has_init)
    y, state = run_prefill(causal_conv1d, *args)
    y_ref, state_ref = run_prefill(causal_conv1d_ref, *args)
    assert y.dtype == dtype
    assert_close(y, y_ref)
    assert_same_bits(state, state_ref)  # windows are copied, not computed
    assert y[-5:].abs().max() == 0


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_causal_conv1d_blocks_inside_and_across_sequences(dtype, assert_close, assert_same_bits):
    x, weight, conv_state = make_inputs(sum(MIXED_LENGTHS), seed=7, dtype=dtype)
    args = (strided(x), weight, conv_state, MIXED_LENGTHS, MIXED_SLOTS, MIXED_INIT)
    y, state = run_prefill(causal_conv1d, *args)
    y_ref, state_ref = run_prefill(causal_conv1d_ref, *args)
    assert_close(y, y_ref)
    assert_same_bits(state, state_ref)  # windows are copied, not computed
    assert y[43:46].abs().max() == 0 and y[83:123].abs().max() == 0


def check_every_tile(tile, args, tiles, check_y, assert_same_bits) -> None:
    """The prefill with each (BT, BC) in tiles gives the default tile's output (check_y: bits on
    the GPU) and its windows (copied: bits everywhere)."""
    y, state = run_prefill(causal_conv1d, *args)
    for bt, bc in tiles:
        tile(bt, bc)
        y_tile, state_tile = run_prefill(causal_conv1d, *args)
        check_y(y_tile, y)
        assert_same_bits(state_tile, state)


def test_causal_conv1d_every_tile_gives_the_default_tiles_output(
    tile, assert_close, assert_same_bits
):
    # Within tolerance: other tiles are sums of other shapes, rounded by numpy under the
    # interpreter; the GPU test below asserts the bits.
    x, weight, conv_state = make_inputs(sum(MIXED_LENGTHS), seed=8, dtype=torch.bfloat16)
    args = (strided(x), weight, conv_state, MIXED_LENGTHS, MIXED_SLOTS, MIXED_INIT)
    check_every_tile(tile, args, [(4, 256), (2, 256), (32, 256)], assert_close, assert_same_bits)


def test_causal_conv1d_many_short_sequences(assert_close, assert_same_bits):
    # More sequences than one lookup step compares, lengths 0 .. 6 around W - 1.
    lengths = [5 * i % 7 for i in range(45)]
    slots = [i if i % 5 else -1 for i in range(45)]
    has_init = [i % 3 > 0 for i in range(45)]
    x, weight, conv_state = make_inputs(sum(lengths), seed=9, dtype=torch.float32, num_slots=45)
    args = (x, weight, conv_state, lengths, slots, has_init)
    y, state = run_prefill(causal_conv1d, *args)
    y_ref, state_ref = run_prefill(causal_conv1d_ref, *args)
    assert_close(y, y_ref)
    assert_same_bits(state, state_ref)  # windows are copied, not computed


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_causal_conv1d_update_batch(dtype, assert_close, assert_same_bits):
    x, weight, conv_state = make_inputs(4, seed=2, dtype=dtype)
    slots = torch.tensor([6, -1, 0, 3])
    state, state_ref = conv_state.clone(), conv_state.clone()
    y = causal_conv1d_update(x, weight, state, state_slots=slots)
    y_ref = causal_conv1d_update_ref(x, weight, state_ref, state_slots=slots)
    assert_close(y, y_ref)
    assert_same_bits(state, state_ref)  # windows are copied, not computed
    assert y[1].abs().max() == 0


def test_causal_conv1d_update_early_state_gives_the_same_bits(assert_same_bits):
    """Windows read before the dependent-launch wait: the same outputs and windows."""
    x, weight, conv_state = make_inputs(4, seed=7, dtype=torch.bfloat16)
    slots = torch.tensor([6, -1, 0, 3])
    runs = []
    for early in (False, True):
        state = conv_state.clone()
        y = causal_conv1d_update(x, weight, state, state_slots=slots, early_state=early)
        runs.append((y, state))
    assert_same_bits(runs[0][0], runs[1][0])
    assert_same_bits(runs[0][1], runs[1][1])


def test_state_handoff_prefill_then_update(assert_close, assert_same_bits):
    x, weight, conv_state = make_inputs(12, seed=3, dtype=torch.bfloat16)
    y_pre, state = run_prefill(causal_conv1d, x[:9], weight, conv_state, [9], [2], [False])
    ys = [y_pre]
    for t in range(9, 12):
        ys.append(causal_conv1d_update(x[t : t + 1], weight, state, state_slots=torch.tensor([2])))
    y_ref, state_ref = run_prefill(causal_conv1d_ref, x, weight, conv_state, [12], [2], [False])
    assert_close(torch.cat(ys), y_ref)
    assert_same_bits(state, state_ref)  # windows are copied, not computed


@pytest.mark.any_device
def test_causal_conv1d_deterministic_and_batch_invariant(assert_same_bits, assert_same_bits_on_gpu):
    """A repeated launch gives the same bits; a sequence alone gives its bits in the batch on
    the GPU (a launch of another shape: within tolerance under the interpreter)."""
    device = "cuda" if torch.cuda.is_available() else "cpu"
    x, weight, conv_state = (t.to(device) for t in make_inputs(30, seed=4, dtype=torch.bfloat16))
    y1, s1 = run_prefill(causal_conv1d, x, weight, conv_state, [7, 23], [0, 1], [True, True])
    y2, s2 = run_prefill(causal_conv1d, x, weight, conv_state, [7, 23], [0, 1], [True, True])
    assert_same_bits(y1, y2)
    assert_same_bits(s1, s2)
    y3, s3 = run_prefill(causal_conv1d, x[7:], weight, conv_state, [23], [1], [True])
    assert_same_bits_on_gpu(y3, y1[7:])
    assert_same_bits(s3[1], s1[1])  # windows are copied, not computed


def test_launchers_reject_bad_inputs():
    x, weight, conv_state = make_inputs(5, seed=5)
    kw = {"cu_seqlens": varlen([5]), "state_slots": torch.tensor([0])}
    with pytest.raises(TypeError, match="conv_state has dtype"):
        causal_conv1d(x, weight, conv_state.bfloat16(), **kw, has_initial_state=torch.tensor([1]))
    with pytest.raises(TypeError, match="has_initial_state has dtype"):
        causal_conv1d(x, weight, conv_state, **kw, has_initial_state=torch.tensor([1]))
    with pytest.raises(ValueError, match="x has 199 channels"):
        causal_conv1d_update(x[:, :199], weight, conv_state, state_slots=torch.tensor([0] * 5))
    with pytest.raises(ValueError, match="conv_state has strides"):
        causal_conv1d_update(
            x, weight, conv_state.transpose(0, 1).contiguous().transpose(0, 1),
            state_slots=torch.tensor([0] * 5),
        )  # fmt: skip


@pytest.mark.gpu
def test_causal_conv1d_real_shapes_gpu(assert_close, assert_same_bits):
    lengths = [8000, 1, 2, 190]
    x, weight, conv_state = (
        t.cuda() for t in make_inputs(sum(lengths), seed=6, dtype=torch.bfloat16, channels=10240)
    )
    args = (x, weight, conv_state, lengths, [3, 0, 5, 1], [True, False, True, True])
    y, state = run_prefill(causal_conv1d, *args)
    y_ref, state_ref = run_prefill(causal_conv1d_ref, *args)
    assert_close(y, y_ref)
    assert_same_bits(state, state_ref)  # windows are copied, not computed
    slots = torch.tensor([5, -1, 0, 3], device="cuda")
    y = causal_conv1d_update(x[:4], weight, state, state_slots=slots)
    y_ref = causal_conv1d_update_ref(x[:4], weight, state_ref, state_slots=slots)
    assert_close(y, y_ref)
    assert_same_bits(state, state_ref)  # windows are copied, not computed


@pytest.mark.gpu
def test_causal_conv1d_same_bits_for_every_tile_gpu(
    tile, assert_same_bits, assert_same_bits_across_shapes
):
    # Compiled, a row computed from registers and one computed token by token must still agree.
    lengths = [3000, 1, 2, 190, 900]
    x, weight, conv_state = (
        t.cuda() for t in make_inputs(sum(lengths), seed=10, dtype=torch.bfloat16, channels=10240)
    )
    slots, has_init = [3, 0, -1, 5, 1], [True, False, True, True, False]
    args = (strided(x), weight, conv_state, lengths, slots, has_init)
    tiles = [(4, 256), (2, 64), (32, 128)]
    check_every_tile(tile, args, tiles, assert_same_bits_across_shapes, assert_same_bits)
