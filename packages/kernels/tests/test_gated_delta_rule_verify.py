"""Recurrent gated delta rule for speculative verify and its commit: against the references, and
against the one-token decode kernel run position by position (the bits a verify must keep)."""

import inspect

import pytest
import torch
from sparkinfer.kernels.gated_delta_rule import (
    fused_recurrent_gated_delta_rule,
    fused_recurrent_gated_delta_rule_commit,
    fused_recurrent_gated_delta_rule_commit_ref,
    fused_recurrent_gated_delta_rule_verify,
    fused_recurrent_gated_delta_rule_verify_ref,
)

H, HV, K, V = 2, 4, 16, 16
GATE_NAMES = ("a", "b", "A_log", "dt_bias")


def verify_layout(num_positions: list[int], device: str = "cpu") -> torch.Tensor:
    """verify_rows [B, T] of a position-major layout (the scheduler's): the rows of position j
    hold every sequence with a position j, in sequence order, after those of position j - 1."""
    T = max(num_positions)
    rows = torch.full((len(num_positions), T), -1, dtype=torch.int64)
    r = 0
    for j in range(T):
        for i, n in enumerate(num_positions):
            if j < n:
                rows[i, j] = r
                r += 1
    return rows.to(device)


def make_rows(N: int, *, seed: int, dtype=torch.bfloat16, device="cpu", shape=(H, HV, K, V)):
    """Random q, k [N, H, K], v [N, HV, V], a, b [N, HV], A_log, dt_bias [HV] by verify row."""
    nh, nhv, dk, dv = shape
    gen = torch.Generator().manual_seed(seed)

    def randn(*s):
        return torch.randn(*s, generator=gen)

    x = {"q": randn(N, nh, dk), "k": randn(N, nh, dk), "v": randn(N, nhv, dv)}
    x |= {"a": randn(N, nhv), "b": randn(N, nhv)}
    x = {n: t.to(device, dtype) for n, t in x.items()}
    x["A_log"] = (torch.rand(nhv, generator=gen) * 2.0).to(device)
    x["dt_bias"] = randn(nhv).to(device)
    return x


def make_state(num_slots: int, *, seed: int, device="cpu", shape=(H, HV, K, V)) -> torch.Tensor:
    _, nhv, dk, dv = shape
    gen = torch.Generator().manual_seed(seed)
    return (torch.randn(num_slots, nhv, dv, dk, generator=gen) * 0.1).to(device)


def run_verify(fn, x, state, slots, rows, **kw) -> torch.Tensor:
    args = tuple(x[n] for n in ("q", "k", "v", *GATE_NAMES))
    return fn(*args, state, state_slots=slots, verify_rows=rows, **kw)


def run_commit(fn, x, state, slots, rows, num_kept) -> None:
    args = tuple(x[n] for n in ("k", "v", *GATE_NAMES))
    fn(*args, state, state_slots=slots, verify_rows=rows, num_kept=num_kept)


def decode_position_by_position(x, state, slots, rows, num_steps) -> torch.Tensor:
    """The decode kernel (early state read, as the model decodes) one position at a time over
    the first num_steps[i] positions of each sequence: -> o [N, HV, V] of those rows (NaN
    elsewhere); `state` advanced in place."""
    o = torch.full(x["v"].shape, float("nan"), dtype=x["v"].dtype, device=x["v"].device)
    for j in range(rows.shape[1]):
        seqs = [i for i in range(rows.shape[0]) if j < int(num_steps[i]) and rows[i, j] >= 0]
        if not seqs:
            continue
        r = rows[seqs, j]
        q, k, v, a, b = (x[n][r] for n in ("q", "k", "v", "a", "b"))
        o[r] = fused_recurrent_gated_delta_rule(
            q, k, v, a, b, x["A_log"], x["dt_bias"], state,
            state_slots=slots[seqs].contiguous(), early_state=True,
        )  # fmt: skip
    return o


@pytest.mark.parametrize(
    ("fast", "ref"),
    [
        (fused_recurrent_gated_delta_rule_verify, fused_recurrent_gated_delta_rule_verify_ref),
        (fused_recurrent_gated_delta_rule_commit, fused_recurrent_gated_delta_rule_commit_ref),
    ],
)
def test_fast_op_signature_matches_ref(fast, ref):
    assert inspect.signature(fast) == inspect.signature(ref)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_verify_matches_ref_and_leaves_the_state(dtype, assert_close, assert_same_bits):
    num_positions = [4, 3, 4, 1, 2]  # a padding sequence among them
    rows = verify_layout(num_positions)
    slots = torch.tensor([5, 0, -1, 2, 3])
    x = make_rows(sum(num_positions), seed=1, dtype=dtype)
    state = make_state(6, seed=2)
    before = state.clone()
    o = run_verify(fused_recurrent_gated_delta_rule_verify, x, state, slots, rows)
    o_ref = run_verify(fused_recurrent_gated_delta_rule_verify_ref, x, state, slots, rows)
    assert o.dtype == dtype
    assert_close(o, o_ref)
    assert_same_bits(state, before)  # read only
    assert o[rows[2][rows[2] >= 0]].abs().max() == 0


def test_verify_with_the_gated_norm_matches_ref(assert_close):
    num_positions = [3, 3, 2]
    rows = verify_layout(num_positions)
    slots = torch.tensor([1, 0, 2])
    x = make_rows(sum(num_positions), seed=3, dtype=torch.bfloat16)
    z = torch.randn(sum(num_positions), HV, V).to(torch.bfloat16)
    norm = {"norm_gate": z, "norm_weight": torch.rand(V) + 0.5, "norm_eps": 1e-6}
    state = make_state(3, seed=4)
    o = run_verify(fused_recurrent_gated_delta_rule_verify, x, state, slots, rows, **norm)
    o_ref = run_verify(fused_recurrent_gated_delta_rule_verify_ref, x, state, slots, rows, **norm)
    assert_close(o, o_ref)


def test_commit_matches_ref(assert_close, assert_same_bits):
    num_positions = [4, 4, 2, 3, 1]
    rows = verify_layout(num_positions)
    slots = torch.tensor([4, 1, -1, 0, 2])
    num_kept = torch.tensor([4, 0, 2, 2, 1])  # all, none, a padding row, some, the input only
    x = make_rows(sum(num_positions), seed=5)
    state, state_ref = make_state(6, seed=6), make_state(6, seed=6)
    before = state.clone()
    run_commit(fused_recurrent_gated_delta_rule_commit, x, state, slots, rows, num_kept)
    run_commit(fused_recurrent_gated_delta_rule_commit_ref, x, state_ref, slots, rows, num_kept)
    assert_close(state, state_ref, torch.float32)
    for untouched in (1, 3, 5):  # kept nothing, the padding row's, no sequence's
        assert_same_bits(state[untouched], before[untouched])


def check_verify_and_commit_equal_decode(x, state, slots, rows, num_kept, same_bits) -> None:
    """Verify rows against a decode step per position, the commit against decode steps over the
    kept positions: the same kernel arithmetic at the same tile shapes."""
    s_verify, s_decode = state.clone(), state.clone()
    o = run_verify(fused_recurrent_gated_delta_rule_verify, x, s_verify, slots, rows)
    o_decode = decode_position_by_position(x, s_decode, slots, rows, rows.ne(-1).sum(1))
    real = rows[(rows >= 0) & (slots >= 0)[:, None]]
    same_bits(o[real], o_decode[real])
    s_decode = state.clone()
    decode_position_by_position(x, s_decode, slots, rows, num_kept)
    run_commit(fused_recurrent_gated_delta_rule_commit, x, s_verify, slots, rows, num_kept)
    same_bits(s_verify, s_decode)


@pytest.mark.any_device
def test_verify_and_commit_give_the_bits_of_decode_steps(assert_same_bits):
    """Same tile shapes as the decode kernel (16-row V tiles, one warp): identical bits, under
    the interpreter too."""
    device = "cuda" if torch.cuda.is_available() else "cpu"
    num_positions = [4, 4, 3, 2, 1]
    rows = verify_layout(num_positions, device)
    slots = torch.tensor([3, 0, 5, -1, 1], device=device)
    num_kept = torch.tensor([2, 4, 3, 1, 1], device=device)
    x = make_rows(sum(num_positions), seed=7, device=device)
    state = make_state(6, seed=8, device=device)
    check_verify_and_commit_equal_decode(x, state, slots, rows, num_kept, assert_same_bits)


@pytest.mark.gpu
@pytest.mark.parametrize("num_seqs", [1, 12, 64])
def test_verify_and_commit_give_the_bits_of_decode_steps_real_shapes_gpu(
    num_seqs, assert_same_bits
):
    """The 27B's heads (H=16, HV=48, K=V=128), four positions a sequence, more sequences than
    the old roll-back rows allowed; every accepted count from 1 to 4."""
    shape = (16, 48, 128, 128)
    gen = torch.Generator().manual_seed(num_seqs)
    num_positions = [4 - (i % 3 == 2) * (i % 4) for i in range(num_seqs)]
    num_positions.sort(reverse=True)
    rows = verify_layout(num_positions, "cuda")
    slots = torch.randperm(num_seqs + 2, generator=gen)[:num_seqs].to("cuda")
    kept = [1 + int(torch.randint(n, (1,), generator=gen)) for n in num_positions]
    num_kept = torch.tensor(kept, device="cuda")
    x = make_rows(sum(num_positions), seed=9, device="cuda", shape=shape)
    state = make_state(num_seqs + 2, seed=10, device="cuda", shape=shape)
    check_verify_and_commit_equal_decode(x, state, slots, rows, num_kept, assert_same_bits)
