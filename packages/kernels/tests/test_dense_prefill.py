"""cuDNN prefill of fresh prompts against the paged-attention reference."""

import contextlib

import pytest
import torch
from sparkinfer.kernels.linear import batch_invariant
from sparkinfer.kernels.paged_attention import paged_attention_prefill, paged_attention_prefill_ref
from sparkinfer.kernels.paged_attention.dense_prefill import (
    MIN_DENSE_TOKENS,
    dense_causal_prefill,
    is_fresh_long_step,
    use_dense_prefill,
)

N = MIN_DENSE_TOKENS


def test_only_steps_of_fresh_long_prompts_qualify():
    assert is_fresh_long_step([0, N], [0])
    assert is_fresh_long_step([0, N, 3 * N + 5], [0, 0])
    assert not is_fresh_long_step([0, N - 1], [0])  # too short
    assert not is_fresh_long_step([0, N, 2 * N], [0, 64])  # one has a cached prefix
    assert not is_fresh_long_step([0], [])  # no sequence


def test_cpu_tensors_and_missing_host_copies_stay_on_the_paged_kernel():
    q, cache = torch.zeros(N, 2, 8), torch.zeros(N // 16, 16, 1, 8)
    assert not use_dense_prefill(q, cache, [0, N], [0])
    assert not use_dense_prefill(q, cache, None, None)


def _fresh_batch(lens, *, block_size=64, heads=(24, 4), d=256, seed=0):
    g = torch.Generator().manual_seed(seed)
    h, hkv = heads
    max_blocks = max(-(-n // block_size) for n in lens) + 1
    num_blocks = len(lens) * max_blocks + 3
    k_cache = torch.randn(num_blocks, block_size, hkv, d, generator=g)
    v_cache = torch.randn(num_blocks, block_size, hkv, d, generator=g)
    block_tables = torch.randperm(num_blocks, generator=g)[: len(lens) * max_blocks]
    qg = torch.randn(sum(lens), h, 2 * d, generator=g)
    cu = [0, *torch.tensor(lens).cumsum(0).tolist()]
    t = {"q": qg[..., :d], "gate": qg[..., d:], "k_cache": k_cache, "v_cache": v_cache,
         "block_tables": block_tables.view(len(lens), max_blocks).to(torch.int32),
         "cu_seqlens": torch.tensor(cu, dtype=torch.int32),
         "cached_lens": torch.zeros(len(lens), dtype=torch.int32)}  # fmt: skip
    return {k: v.to("cuda", torch.bfloat16 if v.is_floating_point() else v.dtype)
            for k, v in t.items()}, cu  # fmt: skip


@pytest.mark.gpu
@pytest.mark.parametrize("use_gate", [True, False])
@pytest.mark.parametrize("lens", [[N], [N + 1, 2 * N + 63, 4100]])
def test_dense_prefill_matches_the_reference_at_27b_heads(lens, use_gate, assert_close):
    b, cu = _fresh_batch(lens, seed=len(lens))
    gate = b["gate"] if use_gate else None
    scale = 256**-0.5
    assert use_dense_prefill(b["q"], b["k_cache"], cu, [0] * len(lens))
    out = dense_causal_prefill(b["q"], b["k_cache"], b["v_cache"], cu_seqlens_cpu=cu,
                               block_tables=b["block_tables"], scale=scale, gate=gate)  # fmt: skip
    expected = paged_attention_prefill_ref(
        b["q"], b["k_cache"], b["v_cache"], cu_seqlens=b["cu_seqlens"],
        cached_lens=b["cached_lens"], block_tables=b["block_tables"], scale=scale, gate=gate,
    )  # fmt: skip
    assert out.shape == b["q"].shape and out.is_contiguous()
    assert_close(out, expected)


@pytest.mark.gpu
@pytest.mark.parametrize("is_invariant", [False, True], ids=["default", "batch_invariant"])
def test_paged_prefill_takes_cudnn_only_with_host_copies_outside_invariance(is_invariant):
    b, cu = _fresh_batch([N + 7], seed=5)
    args = (b["q"], b["k_cache"], b["v_cache"])
    kw = {"cu_seqlens": b["cu_seqlens"], "cached_lens": b["cached_lens"],
          "block_tables": b["block_tables"], "scale": 0.0625, "gate": b["gate"]}  # fmt: skip
    phase = batch_invariant("prefill") if is_invariant else contextlib.nullcontext()
    with phase:
        paged = paged_attention_prefill(*args, **kw)
        chosen = paged_attention_prefill(*args, **kw, cu_seqlens_cpu=cu, cached_lens_cpu=[0])
    dense = dense_causal_prefill(*args, cu_seqlens_cpu=cu, block_tables=b["block_tables"],
                                 scale=0.0625, gate=b["gate"])  # fmt: skip
    assert torch.equal(chosen, paged if is_invariant else dense)
    torch.testing.assert_close(dense.float(), paged.float(), atol=2e-2, rtol=2e-2)
