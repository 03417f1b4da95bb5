"""Fused RMSNorms against their references and transformers' Qwen3.5 norms."""

import inspect

import pytest
import torch
from sparkinfer.kernels.rms_norm import gated_rms_norm, gated_rms_norm_ref, rms_norm, rms_norm_ref
from transformers.models.qwen3_5.modeling_qwen3_5 import Qwen3_5RMSNorm, Qwen3_5RMSNormGated

DTYPES = [torch.float32, torch.bfloat16]
EPS = 1e-6
# Triton's CPU interpreter truncates fp32 -> bf16 casts instead of rounding to nearest, so a bf16
# result that rounds several times may sit a few ulps off on the CPU (exact rounding on a GPU).
INTERPRETER_BF16_TOL = {"atol": 4e-2, "rtol": 4e-2}


def test_signatures_match_references():
    assert inspect.signature(rms_norm) == inspect.signature(rms_norm_ref)
    assert inspect.signature(gated_rms_norm) == inspect.signature(gated_rms_norm_ref)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", [(1, 64), (63, 40), (3, 5, 16), (2, 1000)])
def test_rms_norm_matches_ref(dtype, shape, assert_close):
    torch.manual_seed(0)
    x = torch.randn(shape, dtype=dtype) * 3
    w = (torch.randn(shape[-1]) * 0.2).to(dtype)
    y, res = rms_norm(x, w, EPS)
    y_ref, _ = rms_norm_ref(x, w, EPS)
    assert res is x
    assert_close(y, y_ref)


@pytest.mark.parametrize("dtype", DTYPES)
def test_rms_norm_residual(dtype, assert_close):
    torch.manual_seed(1)
    x, r = torch.randn(2, 17, 96, dtype=dtype), torch.randn(2, 17, 96, dtype=dtype)
    w = torch.randn(96) * 0.2  # fp32 weight on bf16 activations, as some checkpoints store it
    y, res = rms_norm(x, w, EPS, residual=r)
    y_ref, res_ref = rms_norm_ref(x, w, EPS, residual=r)
    # fp32 sums are exact against the reference; bf16 ones differ only by the CPU cast above.
    assert_close(res, res_ref)
    assert_close(y, y_ref)


def test_rms_norm_per_head_on_strided_view(assert_close):
    """q_norm runs on the query half of q_proj's [T, H, 2D] output without a copy."""
    torch.manual_seed(2)
    qg = torch.randn(9, 3, 64, dtype=torch.bfloat16)
    q = qg[..., :32]
    w = (torch.randn(32) * 0.2).to(torch.bfloat16)
    assert_close(rms_norm(q, w, EPS)[0], rms_norm_ref(q, w, EPS)[0])


@pytest.mark.parametrize("shape", [(0, 64), (0, 4, 16)])
def test_norms_take_zero_rows(shape):
    """A step whose chunks sample no row hands the last layer's norms empty inputs."""
    x, w = torch.randn(shape), torch.randn(shape[-1])
    y, res = rms_norm(x, w, EPS, residual=torch.randn(shape))
    assert y.shape == res.shape == shape
    assert gated_rms_norm(x, torch.randn(shape), w, EPS).shape == shape


@pytest.mark.parametrize("dtype", DTYPES)
def test_rms_norm_ref_matches_transformers(dtype, assert_same_bits):
    torch.manual_seed(3)
    hf = Qwen3_5RMSNorm(48, eps=EPS)
    with torch.no_grad():
        hf.weight.normal_(0, 0.2)
    hf = hf.to(dtype)
    x = torch.randn(5, 48, dtype=dtype)
    with torch.no_grad():
        expected = hf(x)
    assert_same_bits(rms_norm_ref(x, hf.weight.detach(), EPS)[0], expected)


@pytest.mark.parametrize("weight_dtype", [torch.bfloat16, torch.float32])
def test_gated_rms_norm_ref_matches_transformers(weight_dtype, assert_same_bits):
    torch.manual_seed(4)
    hf = Qwen3_5RMSNormGated(32, eps=EPS)
    with torch.no_grad():
        hf.weight.normal_(1, 0.2)
    hf = hf.to(weight_dtype)
    x, z = torch.randn(6, 4, 32, dtype=torch.bfloat16), torch.randn(6, 4, 32, dtype=torch.bfloat16)
    with torch.no_grad():
        expected = hf(x, z)
    actual = gated_rms_norm_ref(x, z, hf.weight.detach(), EPS)
    assert_same_bits(actual, expected)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("weight_dtype", [None, torch.float32])
def test_gated_rms_norm_matches_ref(dtype, weight_dtype, assert_close):
    torch.manual_seed(5)
    x, z = torch.randn(7, 6, 128, dtype=dtype), torch.randn(7, 6, 128, dtype=dtype)
    w = (1 + torch.randn(128) * 0.2).to(weight_dtype or dtype)
    y, y_ref = gated_rms_norm(x, z, w, EPS), gated_rms_norm_ref(x, z, w, EPS)
    if dtype == torch.bfloat16:
        torch.testing.assert_close(y.float(), y_ref.float(), **INTERPRETER_BF16_TOL)
    else:
        assert_close(y, y_ref)


def test_rms_norm_rejects_bad_inputs():
    x = torch.randn(4, 32)
    with pytest.raises(ValueError, match="weight must be contiguous"):
        rms_norm(x, torch.zeros(16), EPS)
    with pytest.raises(TypeError, match="x must be float32"):
        rms_norm(x.to(torch.int32), torch.zeros(32), EPS)
    with pytest.raises(ValueError, match="residual must match x"):
        rms_norm(x, torch.zeros(32), EPS, residual=torch.randn(4, 16))
    with pytest.raises(ValueError, match="unit stride"):
        gated_rms_norm(x.t(), x.t(), torch.ones(4), EPS)


@pytest.mark.gpu
def test_rms_norm_real_shapes_on_gpu(assert_close):
    torch.manual_seed(6)
    x = torch.randn(300, 5120, dtype=torch.bfloat16, device="cuda")
    r = torch.randn_like(x)
    w = (torch.randn(5120, device="cuda") * 0.2).to(torch.bfloat16)
    y, res = rms_norm(x, w, EPS, residual=r)
    y_ref, res_ref = rms_norm_ref(x, w, EPS, residual=r)
    assert_close(y, y_ref)
    torch.testing.assert_close(res, res_ref, atol=0, rtol=0)
    q = torch.randn(300, 24, 512, dtype=torch.bfloat16, device="cuda")[..., :256]
    wq = (torch.randn(256, device="cuda") * 0.2).to(torch.bfloat16)
    assert_close(rms_norm(q, wq, EPS)[0], rms_norm_ref(q, wq, EPS)[0])
    xg, zg = torch.randn(2, 300, 48, 128, device="cuda", dtype=torch.bfloat16).unbind(0)
    wg = torch.randn(128, device="cuda").to(torch.bfloat16)
    assert_close(gated_rms_norm(xg, zg, wg, EPS), gated_rms_norm_ref(xg, zg, wg, EPS))
