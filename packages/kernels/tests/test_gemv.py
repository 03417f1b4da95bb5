"""The one-row GEMV against the fp32 reference, and the shape table's GEMV entries."""

import json

import pytest
import torch
from sparkinfer.kernels.activation import silu_and_mul
from sparkinfer.kernels.linear import (
    GemvConfig,
    gemv,
    linear,
    linear_ref,
    linear_swiglu,
    shape_table,
)
from sparkinfer.kernels.tuning import KernelTuning, kernel_tuning

# bf16 outputs: the CPU interpreter truncates the final cast instead of rounding it.
BF16_TOL = {"atol": 5e-2, "rtol": 2e-2}


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize(("n", "k"), [(70, 200), (64, 512), (9, 33)])
def test_gemv_matches_ref(dtype, n, k, assert_close):
    torch.manual_seed(n + k)
    x = torch.randn(1, k, dtype=dtype)
    w = (torch.randn(n, k) * k**-0.5).to(dtype)
    y = gemv(x, w, GemvConfig(BN=8, BK=64, num_warps=4, num_stages=2))  # partial N and K tiles
    assert y.shape == (1, n)
    if dtype == torch.bfloat16:
        torch.testing.assert_close(y.float(), linear_ref(x, w).float(), **BF16_TOL)
    else:
        assert_close(y, linear_ref(x, w))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_gemv_swiglu_epilogue_equals_gemv_then_silu_and_mul(dtype, assert_same_bits):
    torch.manual_seed(3)
    x = torch.randn(1, 96, dtype=dtype)
    w = (torch.randn(2 * 40, 96) * 0.1).to(dtype)
    config = GemvConfig(BN=16, BK=32)
    fused = gemv(x, w, config, swiglu=True)
    assert fused.shape == (1, 40)
    # The same [BN, BK] tiles for the gate and the up rows, then the same silu_mul: same shapes.
    assert_same_bits(fused, silu_and_mul(gemv(x, w, config)))


def test_gemv_rejects_what_it_cannot_do():
    w = torch.randn(8, 16)
    with pytest.raises(ValueError, match="one row"):
        gemv(torch.randn(2, 16), w)
    with pytest.raises(ValueError, match="even weight height"):
        gemv(torch.randn(1, 16), torch.randn(7, 16), swiglu=True)
    with pytest.raises(ValueError, match="contiguous"):
        gemv(torch.randn(1, 16), torch.randn(8, 32)[:, :16])
    with pytest.raises(TypeError, match="share"):
        gemv(torch.randn(1, 16), w.to(torch.bfloat16))


def test_table_loads_gemv_entries_beside_the_skinny_tile():
    entries = [
        {"m": 1, "n": 64, "k": 32, "dtype": "bfloat16", "impl": "gemv",
         "config": {"BN": 32, "BK": 128}, "gemv": {"BN": 8, "BK": 256}},
        {"m": 1, "n": 96, "k": 32, "dtype": "bfloat16", "impl": "gemv", "gemv": {"BN": 16}},
        {"m": 8, "n": 64, "k": 32, "dtype": "bfloat16", "impl": "cublas"},
    ]  # fmt: skip
    skinny = shape_table._load_table(entries)
    one_row = shape_table._load_gemv_table(entries)
    # The skinny tile stays where it beat cuBLAS: the batch-invariant decode mode runs it.
    assert skinny[(1, 64, 32, "bfloat16")] == shape_table.SkinnyGemmConfig(BN=32, BK=128)
    assert skinny[(1, 96, 32, "bfloat16")] is None and skinny[(8, 64, 32, "bfloat16")] is None
    assert one_row == {
        (1, 64, 32, "bfloat16"): GemvConfig(BN=8, BK=256),
        (1, 96, 32, "bfloat16"): GemvConfig(BN=16),
    }


def test_gemv_lookup_takes_the_nearest_measured_width():
    for (m, n, k, dtype), config in shape_table.GEMV_TABLE.items():
        assert m == 1
        assert shape_table.gemv_lookup(n, k, getattr(torch, dtype)) == config
        assert shape_table.gemv_lookup(n + n // 200, k, getattr(torch, dtype)) == config
    assert shape_table.gemv_lookup(7, 9, torch.bfloat16) is None


def test_a_tuning_names_the_dispatchers_table_for_the_launches_inside_it(tmp_path):
    bf16 = torch.bfloat16
    committed = shape_table.gemv_lookup(34816, 5120, bf16)
    assert committed is not None
    table = {"entries": [
        {"m": 1, "n": 34816, "k": 5120, "dtype": "bfloat16", "impl": "cublas"},
        {"m": 8, "n": 34816, "k": 5120, "dtype": "bfloat16", "impl": "triton",
         "config": {"BN": 16, "BK": 128, "SWAP_AB": True}},
    ]}  # fmt: skip
    path = tmp_path / "table.json"
    path.write_text(json.dumps(table))
    other = shape_table.ShapeTable.load(path)
    with kernel_tuning(KernelTuning(shape_table=other)):
        assert shape_table.current_table() is other
        assert shape_table.gemv_lookup(34816, 5120, bf16) is None
        assert shape_table.lookup(8, 34816, 5120, bf16) == shape_table.SkinnyGemmConfig(
            BN=16, BK=128, SWAP_AB=True
        )
        assert shape_table.lookup(8, 14336, 5120, bf16) is None  # not in this table: cuBLAS
    assert shape_table.current_table() is shape_table.COMMITTED
    assert shape_table.gemv_lookup(34816, 5120, bf16) == committed
    assert other.gemv_lookup(34816, 5120, bf16) is None  # the table itself never changed
    assert "entries" in repr(other) and len(repr(other)) < 200


CUDA_ONLY = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


@pytest.mark.gpu
@CUDA_ONLY
@pytest.mark.parametrize(
    ("n", "k"), [(16480, 5120), (14336, 5120), (34816, 5120), (5120, 17408), (5120, 6144)]
)
def test_one_row_linear_real_shapes_on_gpu(n, k, assert_close):
    torch.manual_seed(n)
    x = torch.randn(1, k, device="cuda", dtype=torch.bfloat16)
    w = (torch.randn(n, k, device="cuda") * k**-0.5).to(torch.bfloat16)
    assert_close(linear(x, w), linear_ref(x, w))
    assert_close(gemv(x, w), linear_ref(x, w))
    if n == 34816:
        assert torch.equal(linear_swiglu(x, w), silu_and_mul(linear(x, w)))
