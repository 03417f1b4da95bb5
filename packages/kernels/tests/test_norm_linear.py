"""A norm fused into the skinny GEMM (`rms_norm_linear`, `gated_rms_norm_linear`) against the
norm kernel then the GEMM, and against their references."""

import importlib
import inspect

import pytest
import torch
from sparkinfer.kernels.linear import (
    HeadGatedNorm,
    RowNorm,
    SkinnyGemmConfig,
    batch_invariant,
    gated_rms_norm_linear,
    gated_rms_norm_linear_ref,
    linear,
    rms_norm_linear,
    rms_norm_linear_ref,
    shape_table,
    skinny_gemm,
)
from sparkinfer.kernels.rms_norm import gated_rms_norm, rms_norm, rms_norm_ref

norm_linear_module = importlib.import_module("sparkinfer.kernels.linear.norm_linear")

# bf16 outputs: the CPU interpreter truncates casts to bf16 instead of rounding them, and the
# fused row norm scales the accumulator rather than each input.
BF16_TOL = {"atol": 5e-2, "rtol": 3e-2}
EPS = 1e-6


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
@pytest.mark.parametrize("m", [1, 3, 17])
@pytest.mark.parametrize("with_residual", [True, False])
def test_row_norm_in_the_gemm_matches_norm_then_linear(dtype, m, with_residual, assert_close):
    torch.manual_seed(m)
    x, residual, norm_weight, weight = _row_inputs(m, 200, 70, dtype)  # partial K and N tiles
    residual_out = torch.empty_like(x)
    norm = (
        RowNorm(norm_weight, EPS, residual, residual_out)
        if with_residual
        else RowNorm(norm_weight, EPS)
    )
    y = skinny_gemm(x, weight, SkinnyGemmConfig(BN=16, BK=64), norm=norm)
    expected, expected_residual = rms_norm_linear_ref(
        x, norm_weight, EPS, weight, residual=residual if with_residual else None
    )
    _close(y, expected, assert_close)
    if with_residual:
        _close(residual_out, expected_residual, assert_close)
        if dtype == torch.float32:
            assert torch.equal(residual_out, expected_residual)


@pytest.mark.parametrize("m", [1, 4])
def test_row_norm_with_swiglu_epilogue(m, assert_close):
    torch.manual_seed(5)
    x, residual, norm_weight, _ = _row_inputs(m, 96, 1, torch.float32)
    weight = torch.randn(2 * 40, 96) * 0.1
    residual_out = torch.empty_like(x)
    norm = RowNorm(norm_weight, EPS, residual, residual_out)
    y = skinny_gemm(x, weight, SkinnyGemmConfig(BN=16, BK=32), swiglu=True, norm=norm)
    expected, _ = rms_norm_linear_ref(x, norm_weight, EPS, weight, residual=residual, swiglu=True)
    assert y.shape == (m, 40)
    assert_close(y, expected)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("split_k", [1, 3])
@pytest.mark.parametrize("m", [1, 5])
def test_head_gated_norm_in_the_gemm_matches_norm_then_linear(dtype, split_k, m, assert_close):
    torch.manual_seed(split_k + m)
    heads, d = 6, 32
    x = torch.randn(m, heads, d, dtype=dtype)
    wide = torch.randn(m, 500, dtype=dtype)  # z: a strided view into a wider projection row
    z = wide[:, 100 : 100 + heads * d]
    norm_weight = torch.randn(d).to(dtype)
    weight = (torch.randn(70, heads * d) * 0.1).to(dtype)
    config = SkinnyGemmConfig(BN=16, BK=d, SPLIT_K=split_k)
    y = skinny_gemm(x.view(m, -1), weight, config, norm=HeadGatedNorm(norm_weight, EPS, z))
    expected = gated_rms_norm_linear_ref(x, z.view(m, heads, d), norm_weight, EPS, weight)
    _close(y, expected, assert_close)


def test_fused_norms_reject_what_the_kernel_cannot_do():
    x, residual, norm_weight, weight = _row_inputs(2, 256, 32, torch.float32)
    with pytest.raises(ValueError, match="one K slice"):
        skinny_gemm(x, weight, SkinnyGemmConfig(BK=64, SPLIT_K=2), norm=RowNorm(norm_weight, EPS))
    with pytest.raises(ValueError, match="together"):
        skinny_gemm(x, weight, norm=RowNorm(norm_weight, EPS, residual=residual))
    with pytest.raises(ValueError, match=r"contiguous \[256\]"):
        skinny_gemm(x, weight, norm=RowNorm(norm_weight[:100], EPS))
    with pytest.raises(ValueError, match="residual must be"):
        skinny_gemm(x, weight, norm=RowNorm(norm_weight, EPS, residual[:1], residual[:1]))
    z = torch.randn(2, 256)
    with pytest.raises(ValueError, match="multiple of BK"):
        skinny_gemm(
            x[:, :200], weight[:, :200], SkinnyGemmConfig(BK=64),
            norm=HeadGatedNorm(norm_weight[:64], EPS, z[:, :200]),
        )  # fmt: skip


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


def test_row_norm_tile_choice():
    """One K slice from the table; the bucket below where cuBLAS won 32 rows; none otherwise."""
    choose = norm_linear_module._row_norm_config

    class Rows:  # the rows of a CUDA call, as far as the choice looks at them
        def __init__(self, m: int, k: int):
            self.shape, self.is_cuda = (m, k), True
            self.dtype = torch.bfloat16

        def dim(self) -> int:
            return 2

    gate_up, in_proj, o_proj = (34816, 5120), (16480, 5120), (5120, 6144)
    w = {name: torch.empty(shape, device="meta") for name, shape in
         {"gate_up": gate_up, "in_proj": in_proj, "o_proj": o_proj}.items()}  # fmt: skip
    one_row = choose(Rows(1, 5120), w["gate_up"], True)
    assert one_row == shape_table.lookup(1, *gate_up, torch.bfloat16)
    assert shape_table.lookup(32, *in_proj, torch.bfloat16) is None  # cuBLAS won 32 rows
    assert choose(Rows(32, 5120), w["in_proj"], False) == shape_table.lookup(
        16, *in_proj, torch.bfloat16
    )
    assert choose(Rows(1, 6144), w["o_proj"], False) is None  # split-K: the norm runs apart
    assert choose(Rows(65, 5120), w["gate_up"], True) is None  # beyond the skinny range
    with batch_invariant("decode"):
        assert choose(Rows(1, 5120), w["gate_up"], True) is None


CUDA_ONLY = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")

ROW_SHAPES = [(16480, False), (14336, False), (2 * 17408, True)]  # in_proj, qkv, gate_up


@pytest.mark.gpu
@CUDA_ONLY
@pytest.mark.parametrize("m", [1, 2, 8, 32])
@pytest.mark.parametrize(("n", "swiglu"), ROW_SHAPES)
def test_rms_norm_linear_real_shapes_on_gpu(m, n, swiglu, assert_close):
    torch.manual_seed(m)
    x, residual, norm_weight, weight = _row_inputs(m, 5120, n, torch.bfloat16, "cuda")
    y, stream = rms_norm_linear(x, norm_weight, EPS, weight, residual=residual, swiglu=swiglu)
    h, expected_stream = rms_norm(x, norm_weight, EPS, residual=residual)
    expected = linear(h, weight)
    if swiglu:
        gate, up = expected.float().chunk(2, dim=-1)
        expected = torch.nn.functional.silu(gate) * up
    assert torch.equal(stream, expected_stream)
    assert_close(y, expected, torch.bfloat16)
    y_ref, _ = rms_norm_linear_ref(x, norm_weight, EPS, weight, residual=residual, swiglu=swiglu)
    assert_close(y, y_ref, torch.bfloat16)


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


@pytest.mark.gpu
@CUDA_ONLY
def test_rms_norm_linear_reference_matches_the_norm_reference_on_gpu(assert_close):
    x, residual, norm_weight, weight = _row_inputs(4, 5120, 1024, torch.bfloat16, "cuda")
    h, _ = rms_norm_ref(x, norm_weight, EPS, residual=residual)
    y, _ = rms_norm_linear_ref(x, norm_weight, EPS, weight, residual=residual)
    assert torch.equal(y, torch.nn.functional.linear(h, weight))
