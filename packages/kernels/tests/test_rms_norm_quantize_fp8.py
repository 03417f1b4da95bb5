"""The RMSNorm whose output is also quantized to e4m3 for an FP8 linear, against the norm and
the activation quantizer it fuses, and the FP8 GEMMs taking its quantized rows."""

import inspect

import pytest
import torch
from sparkinfer.kernels.fp8_linear import (
    Fp8Activation,
    Fp8SwapAbConfig,
    fp8_gemm_swap_ab,
    fp8_linear,
    quantize_activation_fp8,
    quantize_activation_fp8_ref,
    quantize_weight_fp8,
)
from sparkinfer.kernels.linear import batch_invariant
from sparkinfer.kernels.rms_norm import (
    rms_norm,
    rms_norm_quantize_fp8,
    rms_norm_quantize_fp8_ref,
    rms_norm_ref,
)

EPS = 1e-6


def _inputs(m: int, n: int, dtype: torch.dtype, seed: int):
    torch.manual_seed(seed)
    x = (torch.randn(m, n) * torch.rand(m, 1) * 6).to(dtype)  # rows of varied magnitude
    residual = torch.randn(m, n, dtype=dtype)
    w = (torch.randn(n) * 0.3).to(dtype)
    return x, residual, w


def test_the_fused_norm_shares_the_signature_of_its_reference():
    assert inspect.signature(rms_norm_quantize_fp8) == inspect.signature(rms_norm_quantize_fp8_ref)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize(
    ("m", "n", "row_multiple"), [(1, 256, 4), (3, 300, 4), (17, 640, 1), (18, 256, 4)]
)
@pytest.mark.parametrize("has_residual", [False, True])
def test_outputs_are_the_norm_and_the_quantizer_bits(
    dtype, m, n, row_multiple, has_residual, assert_same_bits, assert_close
):
    x, r, w = _inputs(m, n, dtype, seed=m + n)
    residual = r if has_residual else None
    y, res, x_fp8 = rms_norm_quantize_fp8(x, w, EPS, residual=residual, row_multiple=row_multiple)
    y_norm, res_norm = rms_norm(x, w, EPS, residual=residual)
    assert_same_bits(y, y_norm)  # the same norm code in the same tiles
    assert_same_bits(res, res_norm)
    q, scale = quantize_activation_fp8(y, row_multiple)
    assert isinstance(x_fp8, Fp8Activation)
    assert x_fp8.scale.stride() == scale.stride()
    assert_same_bits(x_fp8.scale, scale)  # max-abs and a division: no order to round in
    assert_same_bits(x_fp8.q.float(), q.float())
    y_ref, res_ref, ref_fp8 = rms_norm_quantize_fp8_ref(
        x, w, EPS, residual=residual, row_multiple=row_multiple
    )
    assert_close(y, y_ref)
    assert_close(res, res_ref)
    assert ref_fp8.q.shape == x_fp8.q.shape and ref_fp8.scale.stride() == x_fp8.scale.stride()
    q_ref, scale_ref = quantize_activation_fp8_ref(y, row_multiple)  # the composition, on y
    assert_same_bits(x_fp8.scale, scale_ref)
    assert_same_bits(x_fp8.q.float(), q_ref.float())


@pytest.mark.parametrize("m", [1, 5, 32])
def test_fp8_linear_gives_the_same_rows_with_the_quantized_norm_output(m, assert_same_bits):
    x, r, w = _inputs(m, 384, torch.bfloat16, seed=40 + m)
    weight, scale = quantize_weight_fp8(torch.randn(200, 384) * 0.05)
    y, _, x_fp8 = rms_norm_quantize_fp8(x, w, EPS, residual=r)
    assert_same_bits(fp8_linear(y, weight, scale, x_fp8=x_fp8), fp8_linear(y, weight, scale))
    for cfg in (Fp8SwapAbConfig(BN=64), Fp8SwapAbConfig(BN=64, SPLIT_K=2, PREQUANTIZE=True)):
        taken = fp8_gemm_swap_ab(y, weight, scale, cfg, x_fp8=x_fp8)
        assert_same_bits(taken, fp8_gemm_swap_ab(y, weight, scale, cfg))
    for phase in ("decode", "prefill"):  # deterministic mode reads the norm's e4m3 x too
        with batch_invariant(phase):
            taken = fp8_linear(y, weight, scale, x_fp8=x_fp8)
            assert_same_bits(taken, fp8_linear(y, weight, scale))


def test_a_quantized_activation_of_another_shape_is_refused():
    x, _, w = _inputs(4, 256, torch.bfloat16, seed=3)
    weight, scale = quantize_weight_fp8(torch.randn(128, 256) * 0.05)
    _, _, x_fp8 = rms_norm_quantize_fp8(x[:2], w, EPS, row_multiple=1)
    with pytest.raises(ValueError, match="x_fp8 must be x"):
        fp8_gemm_swap_ab(x, weight, scale, x_fp8=x_fp8)  # 4 rows of x, 2 quantized
    with pytest.raises(ValueError, match="x must be"):
        rms_norm_quantize_fp8(x.view(2, 2, 256), w, EPS)


@pytest.mark.gpu
@pytest.mark.parametrize("m", [1, 3, 8, 32, 64, 333, 4096])
@pytest.mark.parametrize("phase", [None, "decode", "prefill"])
def test_bits_of_the_norm_and_quantizer_at_the_27b_width_on_gpu(m, phase):
    torch.manual_seed(m)
    x = torch.randn(m, 5120, device="cuda", dtype=torch.bfloat16) * 4
    r = torch.randn(m, 5120, device="cuda", dtype=torch.bfloat16)
    w = torch.randn(5120, device="cuda", dtype=torch.bfloat16) * 0.3
    if phase is None:
        y, res, x_fp8 = rms_norm_quantize_fp8(x, w, EPS, residual=r)
        y_norm, res_norm = rms_norm(x, w, EPS, residual=r)
    else:
        with batch_invariant(phase):
            y, res, x_fp8 = rms_norm_quantize_fp8(x, w, EPS, residual=r)
            y_norm, res_norm = rms_norm(x, w, EPS, residual=r)
    assert torch.equal(y, y_norm) and torch.equal(res, res_norm)
    q, scale = quantize_activation_fp8(y, 4)
    assert torch.equal(x_fp8.q.view(torch.uint8), q.view(torch.uint8))
    assert torch.equal(x_fp8.scale, scale) and x_fp8.scale.stride() == scale.stride()
    torch.testing.assert_close(y, rms_norm_ref(x, w, EPS, residual=r)[0], atol=3e-2, rtol=2e-2)


@pytest.mark.gpu
@pytest.mark.parametrize("m", [1, 8, 16, 32, 64, 4096])
@pytest.mark.parametrize(("n", "k"), [(16384, 5120), (34816, 5120)])
def test_fp8_linear_with_the_quantized_norm_output_keeps_its_bits_on_gpu(m, n, k):
    torch.manual_seed(n + m)
    weight, scale = quantize_weight_fp8(torch.randn(n, k, device="cuda") * 0.02)
    x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
    w = torch.randn(k, device="cuda", dtype=torch.bfloat16) * 0.3
    y, _, x_fp8 = rms_norm_quantize_fp8(x, w, EPS)
    assert torch.equal(fp8_linear(y, weight, scale, x_fp8=x_fp8), fp8_linear(y, weight, scale))
    if m <= 64:  # every swap-AB path: x in registers, quantized before, or by the norm
        for cfg in (Fp8SwapAbConfig(SPLIT_K=2), Fp8SwapAbConfig(SPLIT_K=2, PREQUANTIZE=True)):
            taken = fp8_gemm_swap_ab(y, weight, scale, cfg, x_fp8=x_fp8)
            assert torch.equal(taken, fp8_gemm_swap_ab(y, weight, scale, cfg))
