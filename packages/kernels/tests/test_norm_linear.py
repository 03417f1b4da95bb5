"""The decoder's norms fused into the one-row GEMV (`rms_norm_linear`, `gated_rms_norm_linear`)
against the norm kernel then the GEMM, and against their references."""

import importlib
import inspect

import pytest
import torch
from sparkinfer.kernels.activation import silu_and_mul
from sparkinfer.kernels.linear import (
    GemvConfig,
    HeadGatedNorm,
    RowNorm,
    batch_invariant,
    gated_rms_norm_linear,
    gated_rms_norm_linear_ref,
    gemv,
    linear,
    linear_swiglu,
    rms_norm_linear,
    rms_norm_linear_ref,
)
from sparkinfer.kernels.rms_norm import gated_rms_norm, rms_norm, rms_norm_ref

norm_linear_module = importlib.import_module("sparkinfer.kernels.linear.norm_linear")

# bf16 outputs: the CPU interpreter truncates casts to bf16 instead of rounding them, and the
# fused row norm scales the sums rather than each input.
BF16_TOL = {"atol": 5e-2, "rtol": 3e-2}
EPS = 1e-6
TILE = GemvConfig(BN=8, BK=64, num_warps=4, num_stages=2)


def _close(actual: torch.Tensor, expected: torch.Tensor, assert_close) -> None:
    if actual.dtype == torch.bfloat16:
        torch.testing.assert_close(actual.float(), expected.float(), **BF16_TOL)
    else:
        assert_close(actual, expected)


def _row_inputs(m: int, k: int, n: int, dtype: torch.dtype, device: str = "cpu"):
    x = torch.randn(m, k, dtype=dtype, device=device)
    residual = torch.randn(m, k, dtype=dtype, device=device)
    norm_weight = (torch.randn(k, device=device) * 0.2).to(dtype)
    weight = (torch.randn(n, k, device=device) * k**-0.5).to(dtype)
    return x, residual, norm_weight, weight


def test_signatures_match_references():
    assert inspect.signature(rms_norm_linear) == inspect.signature(rms_norm_linear_ref)
    assert inspect.signature(gated_rms_norm_linear) == inspect.signature(gated_rms_norm_linear_ref)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("with_residual", [True, False])
@pytest.mark.parametrize(("k", "n"), [(200, 70), (64, 8)])
def test_row_norm_in_the_gemv_matches_norm_then_linear(dtype, with_residual, k, n, assert_close):
    torch.manual_seed(k + n)
    x, residual, norm_weight, weight = _row_inputs(1, k, n, dtype)  # partial K and N tiles
    residual_out = torch.empty_like(x)
    norm = (
        RowNorm(norm_weight, EPS, residual, residual_out)
        if with_residual
        else RowNorm(norm_weight, EPS)
    )
    y = gemv(x, weight, TILE, norm=norm)
    expected, expected_residual = rms_norm_linear_ref(
        x, norm_weight, EPS, weight, residual=residual if with_residual else None
    )
    _close(y, expected, assert_close)
    if with_residual:
        _close(residual_out, expected_residual, assert_close)
        if dtype == torch.float32:
            assert torch.equal(residual_out, expected_residual)


def test_row_norm_with_swiglu_epilogue(assert_close):
    torch.manual_seed(5)
    x, residual, norm_weight, _ = _row_inputs(1, 96, 1, torch.float32)
    weight = torch.randn(2 * 40, 96) * 0.1
    residual_out = torch.empty_like(x)
    norm = RowNorm(norm_weight, EPS, residual, residual_out)
    y = gemv(x, weight, TILE, swiglu=True, norm=norm)
    expected, _ = rms_norm_linear_ref(x, norm_weight, EPS, weight, residual=residual, swiglu=True)
    assert y.shape == (1, 40)
    assert_close(y, expected)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("head_dim", [16, 32, 64])
def test_head_gated_norm_in_the_gemv_matches_norm_then_linear(dtype, head_dim, assert_close):
    torch.manual_seed(head_dim)
    heads = 384 // head_dim  # K = 384: a partial last K tile of 64 is never cut inside a head
    x = torch.randn(1, heads, head_dim, dtype=dtype)
    wide = torch.randn(1, 900, dtype=dtype)  # z: a strided view into a wider projection row
    z = wide[:, 100 : 100 + heads * head_dim]
    norm_weight = torch.randn(head_dim).to(dtype)
    weight = (torch.randn(70, heads * head_dim) * 0.1).to(dtype)
    y = gemv(x.view(1, -1), weight, TILE, norm=HeadGatedNorm(norm_weight, EPS, z))
    expected = gated_rms_norm_linear_ref(x, z.view(1, heads, head_dim), norm_weight, EPS, weight)
    _close(y, expected, assert_close)


def test_fused_norms_reject_what_the_kernel_cannot_do():
    x, residual, norm_weight, weight = _row_inputs(1, 256, 32, torch.float32)
    with pytest.raises(ValueError, match="together"):
        gemv(x, weight, norm=RowNorm(norm_weight, EPS, residual=residual))
    with pytest.raises(ValueError, match=r"contiguous \[256\]"):
        gemv(x, weight, norm=RowNorm(norm_weight[:100], EPS))
    with pytest.raises(ValueError, match="residual must be"):
        gemv(x, weight, norm=RowNorm(norm_weight, EPS, residual[:, :8], residual[:, :8]))
    z = torch.randn(1, 256)
    with pytest.raises(ValueError, match="power of two dividing"):
        gemv(x, weight, GemvConfig(BK=64), norm=HeadGatedNorm(norm_weight[:128], EPS, z))
    with pytest.raises(ValueError, match="power of two dividing"):
        gemv(x, weight, norm=HeadGatedNorm(norm_weight[:96], EPS, z))


def test_cpu_calls_are_the_references():
    torch.manual_seed(2)
    x, residual, norm_weight, weight = _row_inputs(3, 64, 24, torch.float32)
    y, stream = rms_norm_linear(x, norm_weight, EPS, weight, residual=residual)
    y_ref, stream_ref = rms_norm_linear_ref(x, norm_weight, EPS, weight, residual=residual)
    assert torch.equal(y, y_ref) and torch.equal(stream, stream_ref)
    xh, z = torch.randn(3, 2, 32), torch.randn(3, 2, 32)
    w_out = torch.randn(24, 64)
    assert torch.equal(
        gated_rms_norm_linear(xh, z, norm_weight[:32], EPS, w_out),
        gated_rms_norm_linear_ref(xh, z, norm_weight[:32], EPS, w_out),
    )


def test_only_one_row_outside_the_invariant_mode_fuses():
    choose = norm_linear_module._one_row_tile
    w = torch.empty(34816, 5120, dtype=torch.bfloat16, device="meta")
    one_row = torch.empty(1, 5120, dtype=torch.bfloat16, device="meta")
    assert choose(one_row, w) is not None
    assert choose(torch.empty(2, 5120, dtype=torch.bfloat16, device="meta"), w) is None
    assert choose(one_row, w[:, :4096]) is None  # not contiguous
    with batch_invariant("decode"):
        assert choose(one_row, w) is None


def test_the_model_reference_ops_run_torch_linear_after_the_norm():
    torch.manual_seed(4)
    x, residual, norm_weight, weight = _row_inputs(4, 64, 16, torch.bfloat16)
    h, _ = rms_norm_ref(x, norm_weight, EPS, residual=residual)
    y, _ = rms_norm_linear_ref(x, norm_weight, EPS, weight, residual=residual)
    assert torch.equal(y, torch.nn.functional.linear(h, weight))


CUDA_ONLY = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")

ROW_SHAPES = [(16480, False), (14336, False), (2 * 17408, True)]  # in_proj, qkv, gate_up


@pytest.mark.gpu
@CUDA_ONLY
@pytest.mark.parametrize("m", [1, 8])
@pytest.mark.parametrize(("n", "swiglu"), ROW_SHAPES)
def test_rms_norm_linear_real_shapes_on_gpu(m, n, swiglu, assert_close):
    torch.manual_seed(m)
    x, residual, norm_weight, weight = _row_inputs(m, 5120, n, torch.bfloat16, "cuda")
    y, stream = rms_norm_linear(x, norm_weight, EPS, weight, residual=residual, swiglu=swiglu)
    h, expected_stream = rms_norm(x, norm_weight, EPS, residual=residual)
    expected = linear_swiglu(h, weight) if swiglu else linear(h, weight)
    assert torch.equal(stream, expected_stream)
    # Both round differently from the fp32 truth: the two launches round the normed row.
    torch.testing.assert_close(y.float(), expected.float(), atol=3e-2, rtol=3e-2)
    y_ref, _ = rms_norm_linear_ref(x, norm_weight, EPS, weight, residual=residual, swiglu=swiglu)
    torch.testing.assert_close(y.float(), y_ref.float(), atol=3e-2, rtol=3e-2)
    if swiglu and m == 1:  # the first layer: no residual, the input is the stream
        y0, stream0 = rms_norm_linear(x, norm_weight, EPS, weight, swiglu=True)
        assert stream0 is x
        expected0 = silu_and_mul(linear(rms_norm(x, norm_weight, EPS)[0], weight))
        torch.testing.assert_close(y0.float(), expected0.float(), atol=3e-2, rtol=3e-2)


@pytest.mark.gpu
@CUDA_ONLY
@pytest.mark.parametrize("m", [1, 8])
def test_gated_rms_norm_linear_real_shapes_on_gpu(m, assert_close):
    torch.manual_seed(m)
    projected = torch.randn(m, 16480, device="cuda", dtype=torch.bfloat16)
    z = projected[:, 10240 : 10240 + 6144].view(m, 48, 128)
    x = torch.randn(m, 48, 128, device="cuda", dtype=torch.bfloat16)
    norm_weight = torch.randn(128, device="cuda").to(torch.bfloat16)
    weight = (torch.randn(5120, 6144, device="cuda") * 6144**-0.5).to(torch.bfloat16)
    y = gated_rms_norm_linear(x, z, norm_weight, EPS, weight)
    expected = linear(gated_rms_norm(x, z, norm_weight, EPS).view(m, -1), weight)
    assert_close(y, expected, torch.bfloat16)
