"""Gated delta rule: references against transformers, fast ops against references."""

import inspect

import pytest
import torch
import torch.nn.functional as F
from sparkinfer.kernels.gated_delta_rule import (
    chunk_gated_delta_rule,
    chunk_gated_delta_rule_ref,
    fused_recurrent_gated_delta_rule,
    fused_recurrent_gated_delta_rule_ref,
    gdn_gating,
    gdn_gating_ref,
)
from transformers.models.qwen3_5 import modeling_qwen3_5 as hf

H, HV, K, V = 2, 4, 16, 16


def make_inputs(T: int, *, seed: int, dtype: torch.dtype = torch.float32, num_slots: int = 4):
    """Random q, k, v [T, *, *], gates a, b [T, HV], A_log, dt_bias [HV] and a state pool."""
    gen = torch.Generator().manual_seed(seed)

    def randn(*shape):
        return torch.randn(*shape, generator=gen)

    return {
        "q": randn(T, H, K).to(dtype),
        "k": randn(T, H, K).to(dtype),
        "v": randn(T, HV, V).to(dtype),
        "a": randn(T, HV).to(dtype),
        "b": randn(T, HV).to(dtype),
        "A_log": torch.rand(HV, generator=gen) * 2.0,
        "dt_bias": randn(HV),
        "state": randn(num_slots, HV, K, V) * 0.1,
    }


def varlen(lengths: list[int]) -> torch.Tensor:
    return F.pad(torch.tensor(lengths, dtype=torch.int32).cumsum(0), (1, 0)).to(torch.int32)


def test_ref_matches_transformers_chunk_and_recurrent():
    x = make_inputs(70, seed=0)
    g, beta = gdn_gating_ref(x["a"], x["b"], x["A_log"], x["dt_bias"])
    hf_g = -x["A_log"].float().exp() * F.softplus(x["a"].float() + x["dt_bias"])
    torch.testing.assert_close(g, hf_g)
    torch.testing.assert_close(beta, x["b"].sigmoid())

    init = x["state"][1].clone()
    state = x["state"].clone()
    o = chunk_gated_delta_rule_ref(
        x["q"], x["k"], x["v"], g, beta, state,
        cu_seqlens=varlen([70]),
        state_slots=torch.tensor([1]),
        has_initial_state=torch.tensor([True]),
    )  # fmt: skip
    args = (x["q"][None], x["k"][None], x["v"][None], g[None], beta[None])
    for fn in (hf.torch_chunk_gated_delta_rule, hf.torch_recurrent_gated_delta_rule):
        hf_o, hf_state = fn(
            *args, initial_state=init[None], output_final_state=True, use_qk_l2norm_in_kernel=True
        )
        torch.testing.assert_close(o, hf_o[0], atol=1e-4, rtol=1e-4)
        torch.testing.assert_close(state[1], hf_state[0], atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(state[0], x["state"][0])


def test_ref_recurrent_matches_transformers_decode():
    x = make_inputs(3, seed=1)
    slots = torch.tensor([2, -1, 0])
    state = x["state"].clone()
    o = fused_recurrent_gated_delta_rule_ref(
        x["q"], x["k"], x["v"], x["a"], x["b"], x["A_log"], x["dt_bias"], state, state_slots=slots
    )
    g, beta = gdn_gating_ref(x["a"], x["b"], x["A_log"], x["dt_bias"])
    for i, slot in [(0, 2), (2, 0)]:
        hf_o, hf_state = hf.torch_recurrent_gated_delta_rule(
            x["q"][None, i : i + 1], x["k"][None, i : i + 1], x["v"][None, i : i + 1],
            g[None, i : i + 1], beta[None, i : i + 1],
            initial_state=x["state"][slot][None], output_final_state=True,
            use_qk_l2norm_in_kernel=True,
        )  # fmt: skip
        torch.testing.assert_close(o[i], hf_o[0, 0], atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(state[slot], hf_state[0], atol=1e-5, rtol=1e-5)
    assert o[1].abs().max() == 0
    torch.testing.assert_close(state[1], x["state"][1])
    torch.testing.assert_close(state[3], x["state"][3])


@pytest.mark.parametrize(
    ("fast", "ref"),
    [
        (chunk_gated_delta_rule, chunk_gated_delta_rule_ref),
        (fused_recurrent_gated_delta_rule, fused_recurrent_gated_delta_rule_ref),
        (gdn_gating, gdn_gating_ref),
    ],
)
def test_fast_op_signature_matches_ref(fast, ref):
    assert inspect.signature(fast) == inspect.signature(ref)
