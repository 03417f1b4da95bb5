"""Causal conv1d for speculative verify and its commit: against the references, and against the
one-token decode update run position by position (the bits a verify must keep)."""

import inspect

import pytest
import torch
from sparkinfer.kernels.causal_conv1d import (
    causal_conv1d_commit,
    causal_conv1d_commit_ref,
    causal_conv1d_update,
    causal_conv1d_verify,
    causal_conv1d_verify_ref,
)

W = 4


def verify_layout(num_positions: list[int], device: str = "cpu") -> torch.Tensor:
    """verify_rows [B, T] of a position-major layout (the scheduler's)."""
    T = max(num_positions)
    rows = torch.full((len(num_positions), T), -1, dtype=torch.int64)
    r = 0
    for j in range(T):
        for i, n in enumerate(num_positions):
            if j < n:
                rows[i, j] = r
                r += 1
    return rows.to(device)


def make_inputs(num_rows: int, *, seed: int, dtype=torch.bfloat16, channels=200, num_slots=6,
                device="cpu"):  # fmt: skip
    """x [N, C] (a strided view, as the model's projection gives), weight [C, W], conv_state
    [num_slots, W - 1, C]; C is not a tile multiple."""
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(num_rows, channels + 40, generator=gen).to(device, dtype)[:, :channels]
    weight = torch.randn(channels, W, generator=gen).to(device, dtype)
    conv_state = torch.randn(num_slots, W - 1, channels, generator=gen).to(device, dtype)
    return x, weight, conv_state


def update_position_by_position(x, weight, conv_state, slots, rows, num_steps) -> torch.Tensor:
    """The decode update (early state read, as the model decodes) one position at a time over
    the first num_steps[i] positions: -> y [N, C] of those rows; conv_state shifted in place."""
    y = torch.full(x.shape, float("nan"), dtype=x.dtype, device=x.device)
    for j in range(rows.shape[1]):
        seqs = [i for i in range(rows.shape[0]) if j < int(num_steps[i]) and rows[i, j] >= 0]
        if seqs:
            r = rows[seqs, j]
            s = slots[seqs].contiguous()
            y[r] = causal_conv1d_update(x[r], weight, conv_state, state_slots=s, early_state=True)
    return y


@pytest.mark.parametrize(
    ("fast", "ref"),
    [
        (causal_conv1d_verify, causal_conv1d_verify_ref),
        (causal_conv1d_commit, causal_conv1d_commit_ref),
    ],
)
def test_fast_op_signature_matches_ref(fast, ref):
    assert inspect.signature(fast) == inspect.signature(ref)


@pytest.mark.parametrize("op", [causal_conv1d_verify, causal_conv1d_verify_ref])
def test_verify_writes_into_out_and_copies_x_into_x_out(op, assert_same_bits):
    """`out` and `x_out` (the model's verify stash rows) receive the output in place of a new
    tensor and a copy of the (strided) inputs, every row's, a padding sequence's too."""
    num_positions = [4, 2, 1]
    rows = verify_layout(num_positions)
    slots = torch.tensor([1, -1, 3])
    n = sum(num_positions)
    x, weight, conv_state = make_inputs(n, seed=5)
    plain = op(x, weight, conv_state, state_slots=slots, verify_rows=rows)
    y_stash, x_stash = (torch.full((n + 2, x.shape[1]), float("nan"), dtype=x.dtype) for _ in "yx")
    out, x_out = y_stash[:n], x_stash[:n]
    y = op(x, weight, conv_state, state_slots=slots, verify_rows=rows, out=out, x_out=x_out)
    assert y.data_ptr() == out.data_ptr()
    assert_same_bits(out, plain)
    assert_same_bits(x_out, x.contiguous())
    assert y_stash[n:].isnan().all() and x_stash[n:].isnan().all()  # rows past N untouched


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_verify_matches_ref_and_leaves_the_windows(dtype, assert_close, assert_same_bits):
    # Sequences longer and shorter than the window W - 1 = 3, and a padding sequence.
    num_positions = [5, 4, 3, 2, 1]
    rows = verify_layout(num_positions)
    slots = torch.tensor([4, 0, -1, 2, 5])
    x, weight, conv_state = make_inputs(sum(num_positions), seed=1, dtype=dtype)
    before = conv_state.clone()
    y = causal_conv1d_verify(x, weight, conv_state, state_slots=slots, verify_rows=rows)
    y_ref = causal_conv1d_verify_ref(x, weight, conv_state, state_slots=slots, verify_rows=rows)
    assert_close(y, y_ref)
    assert_same_bits(conv_state, before)
    assert y[rows[2][rows[2] >= 0]].abs().max() == 0


def test_commit_matches_ref(assert_same_bits):
    num_positions = [5, 5, 4, 3, 2, 1]
    rows = verify_layout(num_positions)
    slots = torch.tensor([4, 0, 1, -1, 2, 5])
    num_kept = torch.tensor([5, 2, 0, 3, 1, 1])  # past the window, within it, none, padding
    x, _, conv_state = make_inputs(sum(num_positions), seed=2)
    state, state_ref = conv_state.clone(), conv_state.clone()
    kw = {"state_slots": slots, "verify_rows": rows, "num_kept": num_kept}
    causal_conv1d_commit(x, state, **kw)
    causal_conv1d_commit_ref(x, state_ref, **kw)
    assert_same_bits(state, state_ref)  # windows are copied, not computed
    assert_same_bits(state[1], conv_state[1])
    assert_same_bits(state[3], conv_state[3])


def check_verify_and_commit_equal_updates(x, weight, conv_state, slots, rows, num_kept,
                                          same_bits) -> None:  # fmt: skip
    s_verify, s_update = conv_state.clone(), conv_state.clone()
    y = causal_conv1d_verify(x, weight, s_verify, state_slots=slots, verify_rows=rows)
    y_update = update_position_by_position(x, weight, s_update, slots, rows, rows.ne(-1).sum(1))
    real = rows[(rows >= 0) & (slots >= 0)[:, None]]
    same_bits(y[real], y_update[real])
    s_update = conv_state.clone()
    update_position_by_position(x, weight, s_update, slots, rows, num_kept)
    kw = {"state_slots": slots, "verify_rows": rows, "num_kept": num_kept}
    causal_conv1d_commit(x, s_verify, **kw)
    same_bits(s_verify, s_update)


@pytest.mark.any_device
def test_verify_and_commit_give_the_bits_of_decode_updates(assert_same_bits):
    """The decode update's [BR, BC] window tile, summed alike: identical bits on any device."""
    device = "cuda" if torch.cuda.is_available() else "cpu"
    num_positions = [5, 4, 4, 2, 1]
    rows = verify_layout(num_positions, device)
    slots = torch.tensor([3, 0, 5, -1, 1], device=device)
    num_kept = torch.tensor([5, 2, 4, 1, 1], device=device)
    x, weight, conv_state = make_inputs(sum(num_positions), seed=3, device=device)
    check_verify_and_commit_equal_updates(
        x, weight, conv_state, slots, rows, num_kept, assert_same_bits
    )


@pytest.mark.gpu
@pytest.mark.parametrize("num_seqs", [1, 12, 64])
def test_verify_and_commit_give_the_bits_of_decode_updates_real_shapes_gpu(
    num_seqs, assert_same_bits
):
    """The 27B's conv (10240 channels, W = 4), four positions a sequence."""
    gen = torch.Generator().manual_seed(num_seqs)
    num_positions = sorted((4 - (i % 3 == 2) * (i % 4) for i in range(num_seqs)), reverse=True)
    rows = verify_layout(num_positions, "cuda")
    slots = torch.randperm(num_seqs + 2, generator=gen)[:num_seqs].to("cuda")
    kept = [1 + int(torch.randint(n, (1,), generator=gen)) for n in num_positions]
    num_kept = torch.tensor(kept, device="cuda")
    x, weight, conv_state = make_inputs(
        sum(num_positions), seed=4, channels=10240, num_slots=num_seqs + 2, device="cuda"
    )
    check_verify_and_commit_equal_updates(
        x, weight, conv_state, slots, rows, num_kept, assert_same_bits
    )
