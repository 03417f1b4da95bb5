"""Skinny GEMM and the linear dispatcher against the fp32 reference."""

import dataclasses
import inspect

import pytest
import torch
from sparkinfer.kernels.activation import silu_and_mul
from sparkinfer.kernels.linear import (
    SkinnyGemmConfig,
    TiledGemmConfig,
    batch_invariant,
    decode_config,
    dispatch,
    invariant,
    invariant_linear,
    linear,
    linear_ref,
    shape_table,
    silu_mul_linear,
    silu_mul_linear_ref,
    silu_mul_skinny_gemm,
    skinny_gemm,
    tiled_gemm,
)

# bf16 outputs: the CPU interpreter truncates the final cast instead of rounding it.
BF16_TOL = {"atol": 5e-2, "rtol": 2e-2}


def _check(actual: torch.Tensor, expected: torch.Tensor, assert_close) -> None:
    if actual.dtype == torch.bfloat16:
        torch.testing.assert_close(actual.float(), expected.float(), **BF16_TOL)
    else:
        assert_close(actual, expected)


def test_signature_matches_reference():
    assert inspect.signature(linear) == inspect.signature(linear_ref)
    assert inspect.signature(silu_mul_linear) == inspect.signature(silu_mul_linear_ref)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("m", [1, 3, 16, 17, 64, 65])
@pytest.mark.parametrize(
    "config",
    [SkinnyGemmConfig(BN=32, BK=32), SkinnyGemmConfig(BN=16, BK=64, SPLIT_K=3)],
    ids=["no_split", "split_k3"],
)
def test_skinny_gemm_matches_ref(dtype, m, config, assert_close):
    torch.manual_seed(m)
    x = torch.randn(m, 200, dtype=dtype)
    w = torch.randn(72, 200, dtype=dtype) * 0.1
    _check(skinny_gemm(x, w, config), linear_ref(x, w), assert_close)


def test_skinny_gemm_strided_rows(assert_close):
    torch.manual_seed(7)
    x = torch.randn(5, 300)[:, :96]  # row stride 300
    w = torch.randn(40, 96)
    assert_close(skinny_gemm(x, w, SkinnyGemmConfig(BN=16, BK=32, SPLIT_K=2)), linear_ref(x, w))


def test_split_k_is_deterministic():
    torch.manual_seed(8)
    x, w = torch.randn(4, 256), torch.randn(48, 256)
    config = SkinnyGemmConfig(BN=16, BK=32, SPLIT_K=4)
    assert torch.equal(skinny_gemm(x, w, config), skinny_gemm(x, w, config))


def test_linear_on_cpu_matches_ref(assert_close):
    torch.manual_seed(9)
    x, w = torch.randn(3, 64), torch.randn(24, 64)
    assert_close(linear(x, w), linear_ref(x, w))


def test_dispatch_lookup_falls_back_to_larger_bucket():
    assert (
        shape_table.m_bucket(1) == 1
        and shape_table.m_bucket(9) == 16
        and shape_table.m_bucket(65) is None
    )
    assert shape_table.lookup(65, 10240, 5120, torch.bfloat16) is None  # beyond the skinny range
    assert shape_table.lookup(1, 7, 9, torch.bfloat16) is None  # unmeasured shape: cuBLAS


def test_shape_table_entries_are_valid():
    for (m, n, k, dtype), config in shape_table.TABLE.items():
        assert m in shape_table.M_BUCKETS and n > 0 and k > 0 and dtype in ("bfloat16", "float16")
        assert config is None or config.BK >= 16


def test_skinny_gemm_rejects_bad_inputs():
    with pytest.raises(ValueError, match="K=32"):
        skinny_gemm(torch.randn(2, 16), torch.randn(8, 32))
    with pytest.raises(TypeError, match="share"):
        skinny_gemm(torch.randn(2, 16), torch.randn(8, 16, dtype=torch.bfloat16))
    with pytest.raises(ValueError, match="unit stride"):
        skinny_gemm(torch.randn(16, 2).t(), torch.randn(8, 16))


@pytest.mark.gpu
@pytest.mark.parametrize("m", [1, 8, 32, 64])
@pytest.mark.parametrize(("n", "k"), [(10240, 5120), (1024, 5120), (5120, 17408), (5120, 6144)])
def test_linear_real_shapes_on_gpu(m, n, k, assert_close):
    torch.manual_seed(10)
    x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
    w = torch.randn(n, k, device="cuda", dtype=torch.bfloat16) * 0.02
    expected = linear_ref(x, w)
    assert_close(linear(x, w), expected)
    assert_close(skinny_gemm(x, w, SkinnyGemmConfig(BN=64, BK=128, SPLIT_K=4)), expected)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("m", [1, 31, 32, 33, 100])
def test_tiled_gemm_matches_ref(dtype, m, assert_close):
    torch.manual_seed(11 + m)
    x = torch.randn(m, 72, dtype=dtype)
    w = torch.randn(40, 72, dtype=dtype) * 0.1
    config = TiledGemmConfig(BM=32, BN=16, BK=32, GROUP_M=2)
    _check(tiled_gemm(x, w, config), linear_ref(x, w), assert_close)


def test_tiled_gemm_strided_rows_and_empty_k(assert_close):
    torch.manual_seed(12)
    x = torch.randn(6, 300)[:, :64]
    w = torch.randn(24, 64)
    assert_close(tiled_gemm(x, w, TiledGemmConfig(BM=16, BN=16, BK=32)), linear_ref(x, w))
    assert torch.equal(tiled_gemm(torch.ones(3, 0), torch.ones(5, 0)), torch.zeros(3, 5))


def _rows_do_not_depend_on_the_batch(fn, x: torch.Tensor, w: torch.Tensor) -> None:
    """Every row of fn(x) is bit-identical to the same row computed in smaller batches."""
    full = fn(x, w)
    for start, stop in [(0, 1), (3, 4), (5, x.shape[0]), (1, x.shape[0] - 2)]:
        assert torch.equal(fn(x[start:stop], w), full[start:stop]), (start, stop)


def test_tiled_gemm_rows_are_batch_invariant():
    torch.manual_seed(13)
    x, w = torch.randn(70, 96), torch.randn(48, 96)
    config = TiledGemmConfig(BM=32, BN=16, BK=32, GROUP_M=2)
    _rows_do_not_depend_on_the_batch(lambda a, b: tiled_gemm(a, b, config), x, w)


def test_decode_phase_rows_are_batch_invariant(assert_close):
    torch.manual_seed(14)
    x, w = torch.randn(20, 2048), torch.randn(40, 2048) * 0.05
    assert decode_config(40, 2048, torch.float32) == SkinnyGemmConfig(BM=16, BN=16, num_stages=4)
    _rows_do_not_depend_on_the_batch(lambda a, b: invariant_linear(a, b, "decode"), x, w)
    assert_close(invariant_linear(x, w, "decode"), linear_ref(x, w))


def test_decode_config_takes_the_measured_one_row_tile_in_16_row_tiles():
    for n, k in [(34816, 5120), (5120, 17408), (16384, 5120)]:
        measured = shape_table.decode_entry(n, k, torch.bfloat16)
        assert measured is not None
        assert decode_config(n, k) == dataclasses.replace(measured, BM=16)
    assert shape_table.decode_entry(5120, 6144, torch.bfloat16) is None  # cuBLAS won there
    unmeasured = decode_config(5120, 6144)
    assert (unmeasured.BM, unmeasured.BN, unmeasured.SPLIT_K) == (16, 16, 1)  # 320 programs


def test_batch_invariant_sets_and_restores_the_phase():
    assert invariant.current_phase() is None
    with batch_invariant("decode"):
        assert invariant.current_phase() == "decode"
        with batch_invariant("prefill"):
            assert invariant.current_phase() == "prefill"
        assert invariant.current_phase() == "decode"
    assert invariant.current_phase() is None
    with pytest.raises(ValueError, match="'decode' or 'prefill'"), batch_invariant("mixed"):  # type: ignore[arg-type]
        pass


@pytest.mark.gpu
@pytest.mark.parametrize("phase", ["decode", "prefill"])
@pytest.mark.parametrize(("n", "k"), [(16384, 5120), (96, 5120), (5120, 17408), (248320, 5120)])
def test_invariant_linear_real_shapes_on_gpu(phase, n, k):
    torch.manual_seed(15)
    num_rows = 64 if phase == "decode" else 1000
    x = torch.randn(num_rows, k, device="cuda", dtype=torch.bfloat16)
    w = torch.randn(n, k, device="cuda", dtype=torch.bfloat16) * 0.02
    with batch_invariant(phase):
        full = linear(x, w)
        torch.testing.assert_close(full.float(), linear_ref(x, w).float(), atol=2e-2, rtol=2e-2)
        for start, stop in [(0, 1), (7, 8), (3, num_rows), (1, num_rows // 2 + 5)]:
            assert torch.equal(linear(x[start:stop], w), full[start:stop]), (start, stop)


def test_a_slightly_wider_weight_uses_the_nearest_measured_tile():
    bf16 = torch.bfloat16
    measured = shape_table.lookup(1, 16384, 5120, bf16)
    assert measured is not None  # the GDN projection's tile beat cuBLAS at one row
    assert shape_table.lookup(1, 16384 + 96, 5120, bf16) == measured  # + the b and a gate rows
    assert shape_table.decode_entry(16384 + 96, 5120, bf16) == measured
    assert shape_table.lookup(32, 16384 + 96, 5120, bf16) is None  # cuBLAS won at 32 rows
    assert shape_table.lookup(1, 16384 + 400, 5120, bf16) is None  # beyond 1%: unmeasured
    assert shape_table.lookup(1, 16384 + 96, 4096, bf16) is None  # K must match


# [gate | up] of width 2 * 200 (not a multiple of BK: the last K tile is masked) into 72 outputs.
SILU_MUL_CONFIGS = [
    SkinnyGemmConfig(BN=32, BK=32),
    SkinnyGemmConfig(BN=16, BK=64, SPLIT_K=3),
    SkinnyGemmConfig(BM=16, BN=64, BK=32, SPLIT_K=4),
]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("m", [1, 3, 8, 17])
@pytest.mark.parametrize("config", SILU_MUL_CONFIGS, ids=["no_split", "split_k3", "bm16_split_k4"])
def test_silu_mul_skinny_gemm_equals_the_unfused_kernels(dtype, m, config):
    torch.manual_seed(20 + m)
    gate_up = torch.randn(m, 400, dtype=dtype) * 2
    w = torch.randn(72, 200, dtype=dtype) * 0.1
    fused = silu_mul_skinny_gemm(gate_up, w, config)
    assert fused.shape == (m, 72) and fused.dtype == dtype
    assert torch.equal(fused, skinny_gemm(silu_and_mul(gate_up), w, config))
    expected = silu_mul_linear_ref(gate_up.float(), w.float())
    if dtype == torch.bfloat16:
        torch.testing.assert_close(fused.float(), expected, **BF16_TOL)
    else:
        torch.testing.assert_close(fused, expected, atol=2e-4, rtol=2e-4)


def test_silu_mul_skinny_gemm_strided_rows_and_empty_batch():
    torch.manual_seed(21)
    gate_up = torch.randn(5, 300)[:, :192]  # row stride 300
    w = torch.randn(40, 96)
    config = SkinnyGemmConfig(BN=16, BK=32, SPLIT_K=2)
    fused = silu_mul_skinny_gemm(gate_up, w, config)
    assert torch.equal(fused, skinny_gemm(silu_and_mul(gate_up), w, config))
    assert silu_mul_skinny_gemm(torch.ones(0, 192), w).shape == (0, 40)


def test_silu_mul_linear_on_cpu_falls_back_to_the_unfused_ops(monkeypatch, assert_close):
    def fused(*args):
        raise AssertionError("CPU tensors must not take the fused kernel")

    monkeypatch.setattr(dispatch, "silu_mul_skinny_gemm", fused)
    torch.manual_seed(22)
    gate_up, w = torch.randn(3, 128) * 2, torch.randn(24, 64) * 0.1
    y = silu_mul_linear(gate_up, w)
    assert torch.equal(y, linear(silu_and_mul(gate_up), w))
    assert_close(y, silu_mul_linear_ref(gate_up, w))


def test_silu_mul_linear_ref_is_the_unfused_reference():
    torch.manual_seed(23)
    for dtype in (torch.float32, torch.bfloat16):
        gate_up = torch.randn(70, 96, dtype=dtype)
        w = torch.randn(40, 48, dtype=dtype)
        gate, up = gate_up.chunk(2, dim=-1)
        unfused = torch.nn.functional.linear(torch.nn.functional.silu(gate) * up, w)
        assert torch.equal(silu_mul_linear_ref(gate_up, w), unfused)


@pytest.mark.parametrize("fn", [silu_mul_linear, silu_mul_skinny_gemm])
def test_silu_mul_linear_rejects_bad_inputs(fn):
    with pytest.raises(ValueError, match=r"I=32; expected gate_up \[M, 2 \* I\]"):
        fn(torch.randn(2, 48), torch.randn(8, 32))
    with pytest.raises(ValueError, match=r"\[M, 2 \* I\]"):
        fn(torch.randn(2, 3, 64), torch.randn(8, 32))
    with pytest.raises(TypeError, match="share"):
        fn(torch.randn(2, 64), torch.randn(8, 32, dtype=torch.bfloat16))
    with pytest.raises(ValueError, match="unit stride"):
        fn(torch.randn(64, 2).t(), torch.randn(8, 32))


@pytest.mark.gpu
@pytest.mark.parametrize("m", [1, 8, 32, 64])
def test_silu_mul_linear_real_down_shape_on_gpu(m, monkeypatch):
    n, i = 5120, 17408  # Qwen3.8-27B's down_proj
    launches = []
    fused = dispatch.silu_mul_skinny_gemm

    def counted(*args):
        launches.append(args[2])
        return fused(*args)

    monkeypatch.setattr(dispatch, "silu_mul_skinny_gemm", counted)
    torch.manual_seed(24)
    gate_up = torch.randn(m, 2 * i, device="cuda", dtype=torch.bfloat16)
    w = torch.randn(n, i, device="cuda", dtype=torch.bfloat16) * 0.02
    y = silu_mul_linear(gate_up, w)
    # The table takes the skinny GEMM with split-K 4 up to 32 rows, cuBLAS at 64 (unfused).
    config = shape_table.lookup(m, n, i, torch.bfloat16)
    assert launches == ([config] if m <= 32 else [])
    assert config is None or config.SPLIT_K == 4
    assert torch.equal(y, linear(silu_and_mul(gate_up), w))
    torch.testing.assert_close(
        y.float(), silu_mul_linear_ref(gate_up.float(), w.float()), atol=2e-2, rtol=2e-2
    )
    with batch_invariant("decode"):  # the fixed decode tile, unfused
        assert torch.equal(silu_mul_linear(gate_up, w), linear(silu_and_mul(gate_up), w))
    assert len(launches) == (1 if m <= 32 else 0)
