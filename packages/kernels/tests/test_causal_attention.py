"""Causal attention of a prompt's first chunk (SDPA and the gate pass) against its reference and
against the paged prefill on the same tokens."""

import inspect

import pytest
import torch
from sparkinfer.kernels.paged_attention import (
    causal_attention,
    causal_attention_ref,
    paged_attention_prefill,
    paged_attention_prefill_ref,
)
from sparkinfer.kernels.paged_attention.causal import sigmoid_gate

# bf16 outputs: the CPU interpreter truncates casts to bf16 instead of rounding them.
BF16_TOL = {"atol": 3e-2, "rtol": 3e-2}


def _inputs(length, *, heads=(4, 2), d=32, dtype=torch.float32, device="cpu", seed=0):
    """q and gate as the halves of one [T, H, 2D] projection, k and v as strided views of one
    [T, 2 * HKV * D] row, as the model's qkv_proj output gives them."""
    g = torch.Generator().manual_seed(seed)
    h, hkv = heads
    qg = torch.randn(length, h, 2 * d, generator=g).to(dtype).to(device)
    kv = torch.randn(length, 2 * hkv * d + 8, generator=g).to(dtype).to(device)
    k = kv[:, : hkv * d].view(length, hkv, d)
    v = kv[:, hkv * d : 2 * hkv * d].view(length, hkv, d)
    return qg[..., :d], k, v, qg[..., d:]


def _close(actual, expected, assert_close):
    if actual.dtype == torch.bfloat16 and not actual.is_cuda:
        torch.testing.assert_close(actual.float(), expected.float(), **BF16_TOL)
    else:
        assert_close(actual, expected)


def test_signature_matches_reference():
    assert inspect.signature(causal_attention) == inspect.signature(causal_attention_ref)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("length", [1, 63, 64, 65, 300])
def test_matches_reference(dtype, length, assert_close):
    q, k, v, gate = _inputs(length, dtype=dtype, seed=length)
    out = causal_attention(q, k, v, scale=0.3, gate=gate)
    assert out.is_contiguous() and out.shape == q.shape and out.dtype == dtype
    _close(out, causal_attention_ref(q, k, v, scale=0.3, gate=gate), assert_close)


def test_without_gate_and_one_kv_head(assert_close):
    q, k, v, _ = _inputs(70, heads=(6, 1), d=24, seed=3)
    out = causal_attention(q, k, v, scale=0.2)
    assert out.is_contiguous()
    assert_close(out, causal_attention_ref(q, k, v, scale=0.2))


def test_reference_equals_paged_reference_without_prefix():
    """The reference is the paged reference of one uncached sequence whose K/V sit in blocks."""
    q, k, v, gate = _inputs(40, seed=5)
    block_size, hkv, d = 16, k.shape[1], k.shape[2]
    num_blocks = 3
    order = torch.tensor([2, 0, 1], dtype=torch.int32)  # the sequence's blocks, shuffled
    k_cache = torch.zeros(num_blocks, block_size, hkv, d)
    v_cache = torch.zeros_like(k_cache)
    rows = torch.arange(40)
    k_cache[order[rows // block_size].long(), rows % block_size] = k
    v_cache[order[rows // block_size].long(), rows % block_size] = v
    paged = paged_attention_prefill_ref(
        q, k_cache, v_cache, cu_seqlens=torch.tensor([0, 40], dtype=torch.int32),
        cached_lens=torch.tensor([0], dtype=torch.int32), block_tables=order[None], scale=0.3,
        gate=gate,
    )  # fmt: skip
    assert torch.equal(causal_attention_ref(q, k, v, scale=0.3, gate=gate), paged)


def test_sigmoid_gate_reads_strided_views(assert_close):
    o = torch.randn(5, 3, 40).transpose(0, 1)  # [T=3, H=5, D] with a head stride of 120
    gate = torch.randn(3, 5, 80)[..., 40:]
    out = sigmoid_gate(o, gate)
    assert out.is_contiguous()
    assert_close(out, o * torch.sigmoid(gate))


def test_rejects_bad_inputs():
    q, k, v, gate = _inputs(4)
    with pytest.raises(ValueError, match="multiple of HKV"):
        causal_attention(q[:, :3], k, v, scale=0.1)
    with pytest.raises(ValueError, match="same T and D"):
        causal_attention(q, k[:3], v[:3], scale=0.1)
    with pytest.raises(TypeError, match="expected one of"):
        causal_attention(q, k.double(), v.double(), scale=0.1)
    with pytest.raises(ValueError, match="gate is"):
        causal_attention(q, k, v, scale=0.1, gate=gate[:2])
    with pytest.raises(ValueError, match="unit last stride"):
        causal_attention(q, k, torch.randn(4, 32, 2).transpose(1, 2), scale=0.1)


@pytest.mark.gpu
@pytest.mark.parametrize("length", [1, 127, 128, 129, 4100])
def test_matches_paged_prefill_at_real_shapes_on_gpu(length, assert_close):
    """24 query / 4 KV heads, head_dim 256, bf16: the paged kernel on the same tokens."""
    q, k, v, gate = _inputs(length, heads=(24, 4), d=256, dtype=torch.bfloat16, device="cuda",
                            seed=length)  # fmt: skip
    block_size = 64
    num_blocks = -(-length // block_size)
    order = torch.randperm(num_blocks + 2, device="cuda")[:num_blocks].to(torch.int32)
    k_cache = torch.zeros(num_blocks + 2, block_size, 4, 256, dtype=torch.bfloat16, device="cuda")
    v_cache = torch.zeros_like(k_cache)
    rows = torch.arange(length, device="cuda")
    k_cache[order[rows // block_size].long(), rows % block_size] = k
    v_cache[order[rows // block_size].long(), rows % block_size] = v
    scale = 256**-0.5
    paged = paged_attention_prefill(
        q, k_cache, v_cache, cu_seqlens=torch.tensor([0, length], dtype=torch.int32, device="cuda"),
        cached_lens=torch.zeros(1, dtype=torch.int32, device="cuda"), block_tables=order[None],
        scale=scale, gate=gate,
    )  # fmt: skip
    out = causal_attention(q, k, v, scale=scale, gate=gate)
    assert_close(out, paged)
    assert_close(out, causal_attention_ref(q, k, v, scale=scale, gate=gate))
