"""In-place partial rotary embedding against its reference and transformers."""

import inspect

import pytest
import torch
from sparkinfer.kernels.rotary import apply_rotary, apply_rotary_ref
from transformers.models.qwen3_5.modeling_qwen3_5 import apply_rotary_pos_emb


def _cos_sin(num_tokens: int, rot: int, device: str = "cpu") -> tuple[torch.Tensor, torch.Tensor]:
    positions = torch.arange(num_tokens, device=device, dtype=torch.float32) * 37 + 5
    inv_freq = 1e7 ** (-torch.arange(0, rot, 2, device=device, dtype=torch.float32) / rot)
    freqs = positions[:, None] * inv_freq[None, :]
    emb = torch.cat((freqs, freqs), dim=-1)
    return emb.cos(), emb.sin()


def test_signature_matches_reference():
    assert inspect.signature(apply_rotary) == inspect.signature(apply_rotary_ref)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize(("num_tokens", "rot", "d"), [(1, 16, 64), (13, 64, 64), (6, 8, 24)])
def test_rotary_matches_ref(dtype, num_tokens, rot, d, assert_close, assert_same_bits):
    torch.manual_seed(0)
    qg = torch.randn(num_tokens, 6, 2 * d, dtype=dtype)
    q, k = qg[..., :d], torch.randn(num_tokens, 2, d, dtype=dtype)
    cos, sin = _cos_sin(num_tokens, rot)
    q_ref, k_ref = apply_rotary_ref(q.clone(), k.clone(), cos, sin)
    gate_before = qg[..., d:].clone()
    q_out, k_out = apply_rotary(q, k, cos, sin)
    assert q_out is q and k_out is k
    assert_close(q, q_ref)
    assert_close(k, k_ref)
    assert_same_bits(qg[..., d:], gate_before)  # the gate half of the row is untouched


def test_rotary_leaves_tail_dims_untouched(assert_same_bits):
    torch.manual_seed(1)
    q, k = torch.randn(5, 4, 32), torch.randn(5, 2, 32)
    q0, k0 = q.clone(), k.clone()
    apply_rotary(q, k, *_cos_sin(5, 8))
    assert_same_bits(q[..., 8:], q0[..., 8:])
    assert_same_bits(k[..., 8:], k0[..., 8:])
    assert (q[..., :8] != q0[..., :8]).any()


def test_rotary_ref_matches_transformers():
    torch.manual_seed(2)
    q, k = torch.randn(7, 4, 64), torch.randn(7, 2, 64)
    cos, sin = _cos_sin(7, 16)
    # transformers takes [batch, heads, seq, dim] and [batch, seq, rot].
    q_hf, k_hf = apply_rotary_pos_emb(
        q.transpose(0, 1)[None], k.transpose(0, 1)[None], cos[None], sin[None]
    )
    q_ref, k_ref = apply_rotary_ref(q.clone(), k.clone(), cos, sin)
    torch.testing.assert_close(q_ref, q_hf[0].transpose(0, 1))
    torch.testing.assert_close(k_ref, k_hf[0].transpose(0, 1))


def test_rotary_rejects_bad_inputs():
    q, k = torch.randn(3, 4, 16), torch.randn(3, 2, 16)
    cos, sin = _cos_sin(3, 8)
    with pytest.raises(TypeError, match="float32"):
        apply_rotary(q, k, cos.half(), sin.half())
    with pytest.raises(ValueError, match="R even"):
        apply_rotary(q, k, cos[:, :7], sin[:, :7])
    with pytest.raises(ValueError, match="k must be"):
        apply_rotary(q, torch.randn(4, 2, 16), cos, sin)


@pytest.mark.gpu
def test_rotary_real_shapes_on_gpu(assert_close):
    torch.manual_seed(3)
    qg = torch.randn(1000, 24, 512, dtype=torch.bfloat16, device="cuda")
    q, k = qg[..., :256], torch.randn(1000, 4, 256, dtype=torch.bfloat16, device="cuda")
    cos, sin = _cos_sin(1000, 64, "cuda")
    q_ref, k_ref = apply_rotary_ref(q.clone(), k.clone(), cos, sin)
    apply_rotary(q, k, cos, sin)
    assert_close(q, q_ref)
    assert_close(k, k_ref)
