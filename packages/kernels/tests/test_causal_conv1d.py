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
)
from transformers.models.qwen3_5 import modeling_qwen3_5 as hf

C, W = 24, 4


def varlen(lengths: list[int]) -> torch.Tensor:
    return F.pad(torch.tensor(lengths, dtype=torch.int32).cumsum(0), (1, 0)).to(torch.int32)


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
