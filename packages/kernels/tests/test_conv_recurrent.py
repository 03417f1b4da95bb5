"""The conv + recurrent GDN decode launch against the two launches it replaces and the reference."""

import contextlib
import inspect
from dataclasses import dataclass

import pytest
import torch
from sparkinfer.kernels.arrival import arrival_counters
from sparkinfer.kernels.causal_conv1d import causal_conv1d_update
from sparkinfer.kernels.gated_delta_rule import (
    conv_recurrent,
    conv_recurrent_gated_delta_rule,
    conv_recurrent_gated_delta_rule_ref,
    fused_recurrent_gated_delta_rule,
)
from sparkinfer.kernels.linear import batch_invariant


@dataclass(frozen=True)
class Heads:
    H: int = 2
    HV: int = 4
    K: int = 16
    V: int = 16
    W: int = 4

    @property
    def channels(self) -> int:
        return 2 * self.H * self.K + self.HV * self.V


SMALL, REAL = Heads(), Heads(H=16, HV=48, K=128, V=128)
H, HV, K, V = SMALL.H, SMALL.HV, SMALL.K, SMALL.V


def make_inputs(
    num_seqs: int, *, seed: int, dtype=torch.float32, num_slots=6, device="cpu", d=SMALL
) -> dict:
    """A packed projection whose [q | k | v] and z are strided views, gates and both state pools."""
    gen = torch.Generator().manual_seed(seed)
    C, HV, K, V, W = d.channels, d.HV, d.K, d.V, d.W

    def randn(*shape):
        return torch.randn(*shape, generator=gen).to(device)

    packed = randn(num_seqs, C + HV * V + 8).to(dtype)  # [q | k | v | z | 8 more]
    return {
        "x": packed[:, :C],
        "conv_weight": (randn(C, W) * 0.5).to(dtype),
        "conv_state": randn(num_slots, W - 1, C).to(dtype),
        "a": randn(num_seqs, HV).to(dtype),
        "b": randn(num_seqs, HV).to(dtype),
        "A_log": torch.rand(HV, generator=gen).to(device) * 2.0,
        "dt_bias": randn(HV),
        "state": randn(num_slots, HV, K, V) * 0.1,
        "z": packed[:, C : C + HV * V].view(num_seqs, HV, V),
        "norm_weight": (torch.rand(V, generator=gen) + 0.5).to(device, dtype),
    }


def _args(x: dict, conv_state: torch.Tensor, state: torch.Tensor) -> tuple:
    names = ("x", "conv_weight")
    return (*(x[n] for n in names), conv_state, x["a"], x["b"], x["A_log"], x["dt_bias"], state)


def _norm(x: dict, with_norm: bool) -> dict:
    if not with_norm:
        return {}
    return {"norm_gate": x["z"], "norm_weight": x["norm_weight"], "norm_eps": 1e-5}


def two_launches(x: dict, slots: torch.Tensor, conv_state, state, with_norm: bool, d=SMALL):
    """What the model ran before: the conv update, then the recurrent op on its split."""
    y = causal_conv1d_update(x["x"], x["conv_weight"], conv_state, state_slots=slots)
    q, k, v = y.split((d.H * d.K, d.H * d.K, d.HV * d.V), dim=-1)
    n = y.shape[0]
    return fused_recurrent_gated_delta_rule(
        q.reshape(n, d.H, d.K), k.reshape(n, d.H, d.K), v.reshape(n, d.HV, d.V),
        x["a"], x["b"], x["A_log"], x["dt_bias"], state,
        state_slots=slots, **_norm(x, with_norm),
    )  # fmt: skip


def test_signature_matches_ref():
    fast = inspect.signature(conv_recurrent_gated_delta_rule)
    assert fast == inspect.signature(conv_recurrent_gated_delta_rule_ref)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("with_norm", [True, False], ids=["norm", "plain"])
@pytest.mark.parametrize("bv", [16, 8, 4], ids=["whole-head", "2-blocks", "4-blocks"])
def test_one_launch_equals_the_two_it_replaces(dtype, with_norm, bv, assert_close):
    # Three steps carried through both states; a padding row; slots out of order. Split V tiles
    # elect the last block of each head for the norm and the last program of each key head for
    # the q and k windows.
    slots = torch.tensor([4, -1, 0, 5, 2])
    x = make_inputs(5, seed=30, dtype=dtype)
    conv, state = x["conv_state"].clone(), x["state"].clone()
    conv_two, state_two = x["conv_state"].clone(), x["state"].clone()
    conv_ref, state_ref = x["conv_state"].clone(), x["state"].clone()
    for step in range(3):
        x_step = make_inputs(5, seed=40 + step, dtype=dtype)
        x_step |= {n: x[n] for n in ("conv_weight", "A_log", "dt_bias", "norm_weight")}
        o = conv_recurrent.launch_conv_recurrent(
            *_args(x_step, conv, state), slots, H, None, True,
            x_step["z"] if with_norm else None, x_step["norm_weight"] if with_norm else None,
            1e-5, bv=bv, num_warps=4,
        )  # fmt: skip
        o_two = two_launches(x_step, slots, conv_two, state_two, with_norm)
        o_ref = conv_recurrent_gated_delta_rule_ref(
            *_args(x_step, conv_ref, state_ref), state_slots=slots, num_heads=H,
            **_norm(x_step, with_norm),
        )  # fmt: skip
        assert torch.equal(o, o_two), f"step {step}"
        assert torch.equal(conv, conv_two) and torch.equal(state, state_two), f"step {step}"
        assert_close(o, o_ref)
        assert_close(state, state_ref, dtype)  # q, k, v are rounded to dtype after the conv
        assert o[1].abs().max() == 0
    assert torch.equal(conv, conv_ref)
    for slot in (1, 3):  # slots no row names are untouched
        assert torch.equal(conv[slot], x["conv_state"][slot])
        assert torch.equal(state[slot], x["state"][slot])
    assert int(arrival_counters(x["x"].device, "test").count_nonzero()) == 0


def test_default_tiles_and_the_batch_invariant_phase_equal_the_two_launches():
    slots = torch.arange(9)  # from LARGE_BATCH rows: the large batches' tile
    for rows in (slots[:3], slots):
        x = make_inputs(len(rows), seed=31, num_slots=9)
        for phase in (None, "decode"):
            conv, state = x["conv_state"].clone(), x["state"].clone()
            conv_two, state_two = x["conv_state"].clone(), x["state"].clone()
            with batch_invariant(phase) if phase else contextlib.nullcontext():
                o = conv_recurrent_gated_delta_rule(
                    *_args(x, conv, state), state_slots=rows, num_heads=H, **_norm(x, True)
                )
                o_two = two_launches(x, rows, conv_two, state_two, with_norm=True)
            assert torch.equal(o, o_two)
            assert torch.equal(conv, conv_two) and torch.equal(state, state_two)


def test_rejects_bad_inputs():
    x = make_inputs(2, seed=32)
    slots = torch.tensor([0, 1])
    args = _args(x, x["conv_state"], x["state"])
    with pytest.raises(ValueError, match="num_heads=3"):
        conv_recurrent_gated_delta_rule(*args, state_slots=slots, num_heads=3)
    with pytest.raises(ValueError, match="x has 128 channels"):
        conv_recurrent_gated_delta_rule(*args, state_slots=slots, num_heads=1)
    with pytest.raises(ValueError, match="norm_gate and norm_weight together"):
        conv_recurrent_gated_delta_rule(*args, state_slots=slots, num_heads=H, norm_gate=x["z"])
    with pytest.raises(ValueError, match="state_slots"):
        conv_recurrent_gated_delta_rule(*args, state_slots=slots[:1], num_heads=H)


@pytest.mark.gpu
@pytest.mark.parametrize("num_seqs", [1, 4, 8, 32])
def test_real_shapes_gpu(num_seqs, assert_close):
    x = make_inputs(num_seqs, seed=33, dtype=torch.bfloat16, num_slots=num_seqs + 2,
                    device="cuda", d=REAL)  # fmt: skip
    slots = torch.arange(num_seqs, device="cuda")
    slots[0] = -1
    conv, state = x["conv_state"].clone(), x["state"].clone()
    conv_two, state_two = x["conv_state"].clone(), x["state"].clone()
    for _ in range(2):
        o = conv_recurrent_gated_delta_rule(
            *_args(x, conv, state), state_slots=slots, num_heads=REAL.H, **_norm(x, True)
        )
        o_two = two_launches(x, slots, conv_two, state_two, with_norm=True, d=REAL)
        assert_close(o, o_two)
        assert torch.equal(conv, conv_two)
        assert_close(state, state_two, torch.float32)
    assert int(arrival_counters(x["x"].device, "test").count_nonzero()) == 0
