"""Fused SwiGLU activation against its reference."""

import inspect

import pytest
import torch
from sparkinfer.kernels.activation import silu_and_mul, silu_and_mul_ref

# bf16 outputs: the CPU interpreter truncates the final cast instead of rounding it.
BF16_TOL = {"atol": 3e-2, "rtol": 2e-2}


def test_signature_matches_reference():
    assert inspect.signature(silu_and_mul) == inspect.signature(silu_and_mul_ref)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize(("rows", "width"), [(1, 8), (5, 1023), (3, 1025), (65, 40)])
def test_silu_and_mul_matches_ref(dtype, rows, width, assert_close):
    torch.manual_seed(rows + width)
    x = torch.randn(rows, 2 * width, dtype=dtype) * 3
    y, y_ref = silu_and_mul(x), silu_and_mul_ref(x.float())
    assert y.shape == (rows, width) and y.dtype == dtype
    if dtype == torch.bfloat16:
        torch.testing.assert_close(y.float(), y_ref, **BF16_TOL)
    else:
        assert_close(y, y_ref)


def test_silu_and_mul_strided_rows(assert_close):
    torch.manual_seed(3)
    x = torch.randn(4, 100)[:, :64]  # row stride 100
    assert_close(silu_and_mul(x), silu_and_mul_ref(x))


def test_silu_and_mul_rejects_bad_inputs():
    with pytest.raises(ValueError, match="even"):
        silu_and_mul(torch.randn(2, 7))
    with pytest.raises(ValueError, match=r"\[T, 2 \* I\]"):
        silu_and_mul(torch.randn(2, 3, 4))
    with pytest.raises(TypeError, match="dtype"):
        silu_and_mul(torch.ones(2, 4, dtype=torch.int32))


@pytest.mark.gpu
@pytest.mark.parametrize("rows", [1, 32, 4096])
def test_silu_and_mul_real_shapes_on_gpu(rows):
    torch.manual_seed(rows)
    x = torch.randn(rows, 2 * 17408, device="cuda", dtype=torch.bfloat16)
    y = silu_and_mul(x)
    torch.testing.assert_close(y.float(), silu_and_mul_ref(x.float()), atol=2e-2, rtol=1e-2)
