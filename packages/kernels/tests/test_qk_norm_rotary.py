"""Fused q/k norm, rotary and KV-cache write against its reference and the three unfused ops."""

import inspect
from typing import NamedTuple

import pytest
import torch
from sparkinfer.kernels.paged_attention import write_kv_cache_ref
from sparkinfer.kernels.qk_norm_rotary import qk_norm_rotary, qk_norm_rotary_ref
from sparkinfer.kernels.rms_norm import rms_norm_ref
from sparkinfer.kernels.rotary import apply_rotary_ref

DTYPES = [torch.float32, torch.bfloat16]
EPS = 1e-6
# bf16 rounds twice (after the norm and after the rotary), and the CPU interpreter truncates
# fp32 -> bf16 casts instead of rounding them, so CPU bf16 results may sit a few ulps off.
INTERPRETER_BF16_TOL = 4e-2


class Inputs(NamedTuple):
    q: torch.Tensor
    k: torch.Tensor
    v: torch.Tensor
    q_weight: torch.Tensor
    k_weight: torch.Tensor
    cos: torch.Tensor
    sin: torch.Tensor
    k_cache: torch.Tensor
    v_cache: torch.Tensor
    slot_mapping: torch.Tensor


def _cos_sin(num_tokens: int, rot: int, device: str) -> tuple[torch.Tensor, torch.Tensor]:
    positions = torch.arange(num_tokens, device=device, dtype=torch.float32) * 37 + 5
    inv_freq = 1e7 ** (-torch.arange(0, rot, 2, device=device, dtype=torch.float32) / rot)
    freqs = positions[:, None] * inv_freq[None, :]
    emb = torch.cat((freqs, freqs), dim=-1)
    return emb.cos(), emb.sin()


def _inputs(num_tokens, *, heads=(6, 2), d=32, rot=8, block_size=16, dtype=torch.float32,
            weight_dtype=None, device="cpu", seed=0) -> Inputs:  # fmt: skip
    """q/k/v as views of one packed projection [q_h | gate_h per head | k | v], as attention.py
    makes them; NaN caches (torch.empty) with room to spare; every 7th token's slot is -1."""
    g = torch.Generator().manual_seed(seed)
    h, hkv = heads
    proj = (torch.randn(num_tokens, 2 * h * d + 2 * hkv * d, generator=g) * 3).to(dtype)
    proj = proj.to(device)
    q_gate, k, v = proj.split((2 * h * d, hkv * d, hkv * d), dim=-1)
    q = q_gate.view(num_tokens, h, 2 * d)[..., :d]
    weights = [(torch.randn(d, generator=g) * 0.2).to(weight_dtype or dtype) for _ in range(2)]
    num_blocks = -(-num_tokens // block_size) + 2
    k_cache = torch.empty(num_blocks, block_size, hkv, d, dtype=dtype, device=device)
    v_cache = torch.empty(num_blocks, block_size, hkv, d, dtype=dtype, device=device)
    slots = torch.randperm(num_blocks * block_size, generator=g)[:num_tokens]
    slots[::7] = -1
    return Inputs(
        q, k.view(num_tokens, hkv, d), v.view(num_tokens, hkv, d),
        weights[0].to(device), weights[1].to(device), *_cos_sin(num_tokens, rot, device),
        k_cache, v_cache, slots.to(device),
    )  # fmt: skip


def _run(op, x: Inputs) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(q_out, k_cache, v_cache) of op on fresh copies of x's caches."""
    k_cache, v_cache = x.k_cache.clone(), x.v_cache.clone()
    q_out = op(x.q, x.k, x.v, q_weight=x.q_weight, k_weight=x.k_weight, eps=EPS, cos=x.cos,
               sin=x.sin, k_cache=k_cache, v_cache=v_cache,
               slot_mapping=x.slot_mapping)  # fmt: skip
    return q_out, k_cache, v_cache


def _check(actual: torch.Tensor, expected: torch.Tensor, assert_close) -> None:
    """Close within the dtype's tolerance; NaN (never-written cache rows) only where expected."""
    assert (actual.isnan() == expected.isnan()).all()
    actual, expected = actual.nan_to_num(0.0), expected.nan_to_num(0.0)
    if actual.dtype == torch.bfloat16 and not actual.is_cuda:
        tol = INTERPRETER_BF16_TOL
        torch.testing.assert_close(actual.float(), expected.float(), atol=tol, rtol=tol)
    else:
        assert_close(actual, expected)


def test_signature_matches_reference():
    assert inspect.signature(qk_norm_rotary) == inspect.signature(qk_norm_rotary_ref)


def test_ref_composes_the_unfused_references(assert_same_bits):
    x = _inputs(9, dtype=torch.bfloat16, seed=1)
    q_out, k_cache, v_cache = _run(qk_norm_rotary_ref, x)
    q, _ = rms_norm_ref(x.q, x.q_weight, EPS)
    k, _ = rms_norm_ref(x.k, x.k_weight, EPS)
    apply_rotary_ref(q, k, x.cos, x.sin)
    expected_k, expected_v = x.k_cache.clone(), x.v_cache.clone()
    write_kv_cache_ref(k, x.v, expected_k, expected_v, x.slot_mapping)
    assert q_out.is_contiguous()
    assert_same_bits(q_out, q)
    assert_same_bits(k_cache, expected_k, equal_nan=True)
    assert_same_bits(v_cache, expected_v, equal_nan=True)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("num_tokens", [1, 63, 64, 65])
def test_matches_ref(dtype, num_tokens, assert_close, assert_same_bits):
    x = _inputs(num_tokens, dtype=dtype, seed=num_tokens)
    q_in, k_in, v_in = x.q.clone(), x.k.clone(), x.v.clone()
    q_out, k_cache, v_cache = _run(qk_norm_rotary, x)
    q_ref, k_cache_ref, v_cache_ref = _run(qk_norm_rotary_ref, x)
    assert q_out.shape == x.q.shape and q_out.is_contiguous() and q_out.dtype == dtype
    _check(q_out, q_ref, assert_close)
    _check(k_cache, k_cache_ref, assert_close)
    # v is copied, not computed: bit-exact, and skipped slots leave their rows untouched (NaN).
    assert_same_bits(v_cache, v_cache_ref, equal_nan=True)
    num_written = int((x.slot_mapping >= 0).sum())
    assert int((~k_cache.isnan().any(-1).any(-1)).sum()) == num_written
    for after, before in ((x.q, q_in), (x.k, k_in), (x.v, v_in)):
        assert_same_bits(after, before)  # the inputs are left alone


@pytest.mark.parametrize(
    ("heads", "d", "rot"),
    [
        ((8, 4), 64, 64),  # full rotary, whole head groups
        ((3, 1), 24, 8),  # D not a power of two, one ragged head group
        ((6, 3), 32, 2),  # one rotary pair
    ],
)
def test_head_layouts_and_rotary_widths(heads, d, rot, assert_close):
    x = _inputs(17, heads=heads, d=d, rot=rot, seed=d + rot)
    for actual, expected in zip(_run(qk_norm_rotary, x), _run(qk_norm_rotary_ref, x), strict=True):
        _check(actual, expected, assert_close)


def test_fp32_weights_on_bf16_activations(assert_close):
    x = _inputs(11, dtype=torch.bfloat16, weight_dtype=torch.float32, seed=5)
    for actual, expected in zip(_run(qk_norm_rotary, x), _run(qk_norm_rotary_ref, x), strict=True):
        _check(actual, expected, assert_close)


def test_skipped_tokens_still_get_q(assert_close):
    x = _inputs(5, seed=6)._replace(slot_mapping=torch.full((5,), -1, dtype=torch.int64))
    q_out, k_cache, v_cache = _run(qk_norm_rotary, x)
    assert k_cache.isnan().all() and v_cache.isnan().all()
    _check(q_out, _run(qk_norm_rotary_ref, x)[0], assert_close)


def test_rejects_bad_inputs():
    x = _inputs(4)
    with pytest.raises(TypeError, match="float32"):
        _run(qk_norm_rotary, x._replace(cos=x.cos.half(), sin=x.sin.half()))
    with pytest.raises(ValueError, match="R even"):
        _run(qk_norm_rotary, x._replace(cos=x.cos[:, :7], sin=x.sin[:, :7]))
    with pytest.raises(ValueError, match="expected int64"):
        _run(qk_norm_rotary, x._replace(slot_mapping=x.slot_mapping.int()))
    with pytest.raises(ValueError, match="k has shape"):
        _run(qk_norm_rotary, x._replace(k=x.k[:, :1]))
    with pytest.raises(TypeError, match="but the cache is"):
        _run(qk_norm_rotary, x._replace(v=x.v.double()))
    with pytest.raises(ValueError, match="q_weight"):
        _run(qk_norm_rotary, x._replace(q_weight=x.q_weight[:-1]))


@pytest.mark.gpu
@pytest.mark.parametrize("num_tokens", [1, 64, 1000])
def test_real_shapes_on_gpu(num_tokens, assert_close):
    """The 27B attention layer: 24 q / 4 KV heads, D=256, 64 rotary dims, 64-token blocks."""
    x = _inputs(num_tokens, heads=(24, 4), d=256, rot=64, block_size=64, dtype=torch.bfloat16,
                device="cuda", seed=num_tokens)  # fmt: skip
    for actual, expected in zip(_run(qk_norm_rotary, x), _run(qk_norm_rotary_ref, x), strict=True):
        _check(actual, expected, assert_close)


@pytest.mark.gpu
@pytest.mark.parametrize("num_tokens", [1, 64, 1000])
def test_bit_identical_to_unfused_kernels_on_gpu(num_tokens):
    """Same maths order as rms_norm, apply_rotary and write_kv_cache: the same bits, so fusing
    changes no model output."""
    from sparkinfer.kernels.paged_attention import write_kv_cache
    from sparkinfer.kernels.rms_norm import rms_norm
    from sparkinfer.kernels.rotary import apply_rotary

    def unfused(q, k, v, *, q_weight, k_weight, eps, cos, sin, k_cache, v_cache, slot_mapping):
        q_out, _ = rms_norm(q, q_weight, eps)
        k_out, _ = rms_norm(k, k_weight, eps)
        apply_rotary(q_out, k_out, cos, sin)
        write_kv_cache(k_out, v, k_cache, v_cache, slot_mapping)
        return q_out

    x = _inputs(num_tokens, heads=(24, 4), d=256, rot=64, block_size=64, dtype=torch.bfloat16,
                device="cuda", seed=num_tokens)  # fmt: skip
    for actual, expected in zip(_run(qk_norm_rotary, x), _run(unfused, x), strict=True):
        torch.testing.assert_close(actual, expected, atol=0, rtol=0, equal_nan=True)
