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
from sparkinfer.kernels.linear.invariant import batch_invariant

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


def run_commit(fn, x, state, slots, rows, num_kept, **kw) -> None:
    args = tuple(x[n] for n in ("k", "v", *GATE_NAMES))
    fn(*args, state, state_slots=slots, verify_rows=rows, num_kept=num_kept, **kw)


def model_norm(x, *, seed: int) -> dict:
    """The gated norm's inputs as the model passes them: gate z [N, HV, V] by row, weight, eps."""
    gen = torch.Generator().manual_seed(seed)
    v = x["v"]
    z = torch.randn(v.shape, generator=gen).to(v.device, v.dtype)
    weight = (torch.rand(v.shape[2], generator=gen) + 0.5).to(v.device, v.dtype)
    return {"norm_gate": z, "norm_weight": weight, "norm_eps": 1e-6}


def decode_position_by_position(x, state, slots, rows, num_steps, norm=None) -> torch.Tensor:
    """The decode kernel called as the model decodes (early state read, the gated norm when
    given), one position at a time over the first num_steps[i] positions of each sequence:
    -> o [N, HV, V] of those rows (NaN elsewhere); `state` advanced in place."""
    o = torch.full(x["v"].shape, float("nan"), dtype=x["v"].dtype, device=x["v"].device)
    for j in range(rows.shape[1]):
        seqs = [i for i in range(rows.shape[0]) if j < int(num_steps[i]) and rows[i, j] >= 0]
        if not seqs:
            continue
        r = rows[seqs, j]
        q, k, v, a, b = (x[n][r] for n in ("q", "k", "v", "a", "b"))
        kw = {} if norm is None else norm | {"norm_gate": norm["norm_gate"][r]}
        o[r] = fused_recurrent_gated_delta_rule(
            q, k, v, a, b, x["A_log"], x["dt_bias"], state,
            state_slots=slots[seqs].contiguous(), early_state=True, **kw,
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


def check_verify_and_commit_against_decode(
    x, state, slots, rows, num_kept, same, norm=None, same_output=None
):
    """Verify rows against a decode step per position, the commit against decode steps over the
    kept positions, all called as the model calls them (early_state, the norm): `same` compares
    the states, and the outputs unless same_output is given."""
    s_verify, s_decode = state.clone(), state.clone()
    kw = {} if norm is None else norm
    o = run_verify(fused_recurrent_gated_delta_rule_verify, x, s_verify, slots, rows,
                   early_state=True, **kw)  # fmt: skip
    o_decode = decode_position_by_position(x, s_decode, slots, rows, rows.ne(-1).sum(1), norm)
    real = rows[(rows >= 0) & (slots >= 0)[:, None]]
    (same_output or same)(o[real], o_decode[real])
    s_decode = state.clone()
    decode_position_by_position(x, s_decode, slots, rows, num_kept, norm)
    run_commit(fused_recurrent_gated_delta_rule_commit, x, s_verify, slots, rows, num_kept,
               early_state=True)  # fmt: skip
    same(s_verify, s_decode)


@pytest.mark.any_device
@pytest.mark.parametrize("with_norm", [False, True])
def test_verify_and_commit_give_the_bits_of_decode_steps(with_norm, assert_same_bits, assert_close):
    """The decode kernel's own build at its tile (16-row V tiles, one warp) under
    batch_invariant, where decode takes V tiles and the norm after: identical bits, under the
    interpreter too (the norm launched after tiles these few rows by their count: its outputs
    within tolerance here, bits in the real-shapes GPU test)."""
    device = "cuda" if torch.cuda.is_available() else "cpu"
    num_positions = [4, 4, 3, 2, 1]
    rows = verify_layout(num_positions, device)
    slots = torch.tensor([3, 0, 5, -1, 1], device=device)
    num_kept = torch.tensor([2, 4, 3, 1, 1], device=device)
    x = make_rows(sum(num_positions), seed=7, device=device)
    norm = model_norm(x, seed=11) if with_norm else None
    state = make_state(6, seed=8, device=device)
    with batch_invariant("decode"):
        check_verify_and_commit_against_decode(
            x, state, slots, rows, num_kept, assert_same_bits, norm,
            assert_close if with_norm else None,
        )  # fmt: skip


def _real_shapes_case(num_seqs: int):
    """The 27B's heads (H=16, HV=48, K=V=128), four positions a sequence or fewer, more
    sequences than the old roll-back rows allowed; every accepted count from 1 to 4."""
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
    return x, state, slots, rows, num_kept


@pytest.mark.gpu
@pytest.mark.parametrize("num_seqs", [1, 3, 12, 64])
def test_verify_and_commit_give_the_bits_of_decode_steps_real_shapes_gpu(
    num_seqs, assert_same_bits
):
    """Deterministic mode (the runner's numerics: batch_invariant("decode")), the model's decode
    call (early_state, the gated norm): verify outputs and the committed state have the bits of
    decode steps."""
    x, state, slots, rows, num_kept = _real_shapes_case(num_seqs)
    norm = model_norm(x, seed=12)
    with batch_invariant("decode"):
        check_verify_and_commit_against_decode(
            x, state, slots, rows, num_kept, assert_same_bits, norm
        )


@pytest.mark.gpu
@pytest.mark.parametrize("num_seqs", [1, 3, 12, 64])
def test_verify_and_commit_match_decode_steps_default_mode_gpu(num_seqs, assert_close):
    """Outside batch_invariant decode runs the norm in the kernel on whole heads up to
    NORM_IN_KERNEL_MAX_SEQS sequences: verify and commit then agree within tolerance."""
    x, state, slots, rows, num_kept = _real_shapes_case(num_seqs)
    norm = model_norm(x, seed=12)

    def close(actual, expected):
        assert_close(actual, expected, actual.dtype)

    check_verify_and_commit_against_decode(x, state, slots, rows, num_kept, close, norm)
