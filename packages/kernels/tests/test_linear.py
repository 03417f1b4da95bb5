"""Skinny GEMM and the linear dispatcher against the fp32 reference."""

import contextlib
import dataclasses
import importlib
import inspect

import pytest
import torch
from sparkinfer.kernels.activation import silu_and_mul
from sparkinfer.kernels.linear import (
    SkinnyGemmConfig,
    TiledGemmConfig,
    batch_invariant,
    decode_config,
    invariant,
    invariant_linear,
    linear,
    linear_ref,
    linear_swiglu,
    linear_swiglu_ref,
    shape_table,
    skinny_gemm,
    tiled_gemm,
)
from sparkinfer.kernels.linear.skinny_gemm import split_k_slices

# The module, not the function the package exports under the same name.
skinny_gemm_module = importlib.import_module("sparkinfer.kernels.linear.skinny_gemm")
split_k_module = importlib.import_module("sparkinfer.kernels.split_k")
tiled_gemm_module = importlib.import_module("sparkinfer.kernels.linear.tiled_gemm")

# bf16 outputs: the CPU interpreter truncates the final cast instead of rounding it.
BF16_TOL = {"atol": 5e-2, "rtol": 2e-2}


def _check(actual: torch.Tensor, expected: torch.Tensor, assert_close) -> None:
    if actual.dtype == torch.bfloat16:
        torch.testing.assert_close(actual.float(), expected.float(), **BF16_TOL)
    else:
        assert_close(actual, expected)


def test_signature_matches_reference():
    assert inspect.signature(linear) == inspect.signature(linear_ref)
    assert inspect.signature(linear_swiglu) == inspect.signature(linear_swiglu_ref)


@pytest.mark.parametrize("swap_ab", [False, True], ids=["x_first", "weight_first"])
@pytest.mark.parametrize(("dtype", "m"), [(torch.float32, 5), (torch.bfloat16, 17)])
def test_swiglu_epilogue_equals_gemm_then_silu_and_mul(dtype, m, swap_ab, assert_close):
    """Within tolerance: the fused launch's gate and up tiles are dots of other shapes than the
    plain GEMM's, and under the interpreter their rounding is numpy's. The GPU test
    `test_linear_swiglu_equals_linear_then_silu_and_mul_on_gpu` asserts the bits."""
    torch.manual_seed(13)
    x = torch.randn(m, 96, dtype=dtype)
    w = torch.randn(2 * 40, 96, dtype=dtype) * 0.1  # I = 40: a partial last column tile
    config = SkinnyGemmConfig(BN=16, BK=32, SWAP_AB=swap_ab)
    fused = skinny_gemm(x, w, config, swiglu=True)
    assert fused.shape == (m, 40)
    _check(fused, silu_and_mul(skinny_gemm(x, w, config)), assert_close)
    assert_close(fused, linear_swiglu_ref(x, w))
    assert_close(linear_swiglu(x, w), linear_swiglu_ref(x, w))  # CPU: GEMM then SwiGLU


def test_swiglu_epilogue_needs_one_k_slice_and_stacked_halves():
    x = torch.randn(2, 256)
    with pytest.raises(ValueError, match="one K slice"):
        skinny_gemm(x, torch.randn(64, 256), SkinnyGemmConfig(BN=16, BK=32, SPLIT_K=2), swiglu=True)
    with pytest.raises(ValueError, match="even weight height"):
        skinny_gemm(x, torch.randn(63, 256), swiglu=True)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("m", [1, 3, 16, 17, 64, 65])
@pytest.mark.parametrize(
    "config",
    [
        SkinnyGemmConfig(BN=32, BK=32),
        SkinnyGemmConfig(BN=16, BK=64, SPLIT_K=3),
        SkinnyGemmConfig(BN=32, BK=32, SWAP_AB=True),
        SkinnyGemmConfig(BN=16, BK=64, SPLIT_K=3, SWAP_AB=True),
    ],
    ids=["no_split", "split_k3", "weight_first", "weight_first_split_k3"],
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


def test_split_k_is_deterministic(assert_same_bits):
    torch.manual_seed(8)
    x, w = torch.randn(4, 256), torch.randn(48, 256)
    config = SkinnyGemmConfig(BN=16, BK=32, SPLIT_K=4)
    assert_same_bits(skinny_gemm(x, w, config), skinny_gemm(x, w, config))


def _sum_in_slice_order(x: torch.Tensor, w: torch.Tensor, split_k: int) -> torch.Tensor:
    """The slices' fp32 partials summed from slice 0 up: what the last slice to arrive stores."""
    slices = zip(x.chunk(split_k, 1), w.chunk(split_k, 1), strict=True)
    parts = [xs.double() @ ws.double().T for xs, ws in slices]
    total = torch.zeros_like(parts[0]).float()
    for p in parts:
        total += p.float()
    return total


@pytest.mark.parametrize("swap_ab", [False, True], ids=["x_first", "weight_first"])
@pytest.mark.parametrize("split_k", [1, 3])
@pytest.mark.parametrize("m", [5, 37])
def test_tma_tiles_equal_the_pointer_loads(swap_ab, split_k, m, assert_same_bits):
    # Descriptor tiles zero-fill past M, N (40 = 2.5 tiles) and K (3 slices of 128 over 352).
    # fp32: the interpreter's descriptors do not take bf16.
    torch.manual_seed(12)
    x, w = torch.randn(m, 352), torch.randn(40, 352)
    config = SkinnyGemmConfig(BN=16, BK=32, SPLIT_K=split_k, SWAP_AB=swap_ab)
    with_tma = skinny_gemm(x, w, dataclasses.replace(config, TMA=True))
    assert_same_bits(with_tma, skinny_gemm(x, w, config))  # the same tiles, loaded otherwise
    torch.testing.assert_close(with_tma, x @ w.T, atol=2e-4, rtol=2e-4)


@pytest.mark.parametrize("swap_ab", [False, True], ids=["x_first", "weight_first"])
def test_split_k_last_slice_sums_every_slice_and_resets_the_counters(swap_ab, assert_close):
    torch.manual_seed(11)
    x, w = torch.randn(5, 384), torch.randn(40, 384)
    # 3 column tiles, partial last one
    config = SkinnyGemmConfig(BN=16, BK=32, SPLIT_K=3, SWAP_AB=swap_ab)
    for _ in range(3):  # later launches reuse the counters the earlier ones left at zero
        assert_close(skinny_gemm(x, w, config), _sum_in_slice_order(x, w, 3))
    counters = split_k_module._arrival_counters[(x.device, 0)]
    assert int(counters.count_nonzero()) == 0


@pytest.mark.gpu
@pytest.mark.parametrize("phase", [None, "decode"])
@pytest.mark.parametrize("m", [1, 8, 16, 32])
def test_linear_swiglu_equals_linear_then_silu_and_mul_on_gpu(phase, m):
    torch.manual_seed(14)
    x = torch.randn(m, 5120, device="cuda", dtype=torch.bfloat16)
    w = torch.randn(2 * 17408, 5120, device="cuda", dtype=torch.bfloat16) * 0.02
    with batch_invariant(phase) if phase else contextlib.nullcontext():
        assert torch.equal(linear_swiglu(x, w), silu_and_mul(linear(x, w)))


@pytest.mark.gpu
def test_split_k_in_cuda_graph_replays_equal_eager_on_gpu():
    torch.manual_seed(12)
    x = torch.randn(8, 17408, device="cuda", dtype=torch.bfloat16)
    w = torch.randn(5120, 17408, device="cuda", dtype=torch.bfloat16) * 0.02
    config = SkinnyGemmConfig(BN=64, BK=128, SPLIT_K=4)
    stream = torch.cuda.Stream()
    with torch.cuda.stream(stream):
        eager = skinny_gemm(x, w, config)  # warm-up on the capture stream makes its counters
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, stream=stream):
            out = skinny_gemm(x, w, config)
    for _ in range(3):
        graph.replay()
        torch.cuda.synchronize()
        assert torch.equal(out, eager)


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
@pytest.mark.parametrize("m", [1, 8, 32, 33, 64])
@pytest.mark.parametrize(
    ("n", "k"),
    [(10240, 5120), (1024, 5120), (16480, 5120), (14336, 5120), (34816, 5120), (5120, 17408),
     (5120, 6144)],
)  # fmt: skip
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


def test_tiled_gemm_strided_rows_and_empty_k(assert_close, assert_same_bits):
    torch.manual_seed(12)
    x = torch.randn(6, 300)[:, :64]
    w = torch.randn(24, 64)
    assert_close(tiled_gemm(x, w, TiledGemmConfig(BM=16, BN=16, BK=32)), linear_ref(x, w))
    assert_same_bits(tiled_gemm(torch.ones(3, 0), torch.ones(5, 0)), torch.zeros(3, 5))


def _batches_launch_one_reduction(fn, x, w, recorder, reduction, assert_close) -> set:
    """Each batch of rows from x launches with the same `reduction(launch)` (tiles, K slices and
    steps: what fixes the order in which a row's products are summed), and each row matches the
    full batch's within tolerance; returns the launches' grids' row-tile counts.

    Not bits: under the interpreter tl.dot is numpy's matmul, whose rounding depends on the BLAS
    kernel the CPU picks and on where a row sits in its tile. The GPU tests assert the bits.
    """
    full = fn(x, w)
    for start, stop in [(0, 1), (3, 4), (5, x.shape[0]), (1, x.shape[0] - 2)]:
        assert_close(fn(x[start:stop], w), full[start:stop])
    assert len({reduction(launch) for launch in recorder.launches}) == 1
    return {launch.kwargs.get("BM") for launch in recorder.launches}


@pytest.mark.parametrize("tma", [False, True])
def test_tiled_gemm_rows_are_batch_invariant(tma, record_launches, assert_close):
    torch.manual_seed(13)
    x, w = torch.randn(70, 96), torch.randn(48, 96)
    config = TiledGemmConfig(BM=32, BN=16, BK=32, GROUP_M=2, TMA=tma)
    recorder = record_launches(tiled_gemm_module, "_tiled_gemm_kernel")

    def reduction(launch):  # every compile-time constant, and K
        return tuple(sorted(launch.kwargs.items())), launch.ints[2]

    fn = lambda a, b: tiled_gemm(a, b, config)
    assert _batches_launch_one_reduction(fn, x, w, recorder, reduction, assert_close) == {32}
    assert recorder.launches[0].kwargs["TMA"] is tma
    assert_close(tiled_gemm(x, w, config), linear_ref(x, w))


def _skinny_reduction(launch):
    """A skinny launch's constants but its row tile, and its K and K per slice."""
    constants = {k: v for k, v in launch.kwargs.items() if k != "BM"}
    return tuple(sorted(constants.items())), launch.ints[2], launch.ints[3]


@pytest.mark.parametrize(("dtype", "tiles"), [(torch.float32, {16}), (torch.bfloat16, {16, 64})])
def test_decode_phase_rows_are_batch_invariant(dtype, tiles, record_launches, assert_close):
    """fp32 keeps 16-row tiles; bf16 grows them with the batch, with the same K slices and
    steps (the GPU test `test_decode_row_tiles_give_the_same_bits` asserts the bits)."""
    torch.manual_seed(14)
    x = torch.randn(40, 2048, dtype=dtype)
    w = torch.randn(40, 2048, dtype=dtype) * 0.05
    assert decode_config(40, 2048, dtype) == SkinnyGemmConfig(BM=16, BN=16, num_stages=4)
    recorder = record_launches(skinny_gemm_module, "_skinny_gemm_kernel")
    fn = lambda a, b: invariant_linear(a, b, "decode")
    check = lambda actual, expected: _check(actual, expected, assert_close)
    used = _batches_launch_one_reduction(fn, x, w, recorder, _skinny_reduction, check)
    assert used == tiles
    check(invariant_linear(x, w, "decode"), linear_ref(x, w))


_MODEL_SHAPES = [(34816, 5120), (5120, 17408), (16384, 5120), (16480, 5120), (5120, 6144),
                 (6144, 5120), (10240, 5120), (12288, 5120), (248320, 5120)]  # fmt: skip


def test_decode_tiles_of_a_weight_share_one_k_plan():
    """Every row range's tile of a weight sums over K the same way (BK, slices, SWAP_AB)."""
    for n, k in _MODEL_SHAPES:
        plan = invariant.decode_k_plan(n, k)
        for rows in invariant.DECODE_TILE_ROWS:
            config = decode_config(n, k, torch.bfloat16, rows)
            assert rows == config.BM
            assert (config.BK, split_k_slices(k, config)[0], config.SWAP_AB) == plan, (n, k, rows)


def test_decode_tiles_take_the_measured_tile_of_their_range_where_it_shares_the_plan():
    bf16 = torch.bfloat16
    widest = shape_table.lookup(64, 16384, 5120, bf16)
    assert widest is not None and decode_config(16384, 5120, bf16, 64) == dataclasses.replace(
        widest, BM=64
    )
    measured_32 = shape_table.lookup(32, 16384, 5120, bf16)
    assert measured_32 is not None and measured_32.BK == widest.BK
    assert decode_config(16384, 5120, bf16, 32) == dataclasses.replace(measured_32, BM=32)
    # 5120x6144's 16-row tile steps K by 256: the 16-row range keeps the 64-row tile's plan
    measured_16 = shape_table.lookup(16, 5120, 6144, bf16)
    assert measured_16 is not None and measured_16.BK != decode_config(5120, 6144, bf16, 16).BK
    assert shape_table.decode_entry(10240, 5120, bf16) is None  # cuBLAS won every range there
    unmeasured = decode_config(10240, 5120)
    assert (unmeasured.BM, unmeasured.BN, unmeasured.SPLIT_K) == (16, 32, 1)  # 320 programs


@pytest.mark.parametrize("swap_ab", [False, True])
def test_tiles_with_one_k_plan_launch_one_reduction(swap_ab, record_launches, assert_close):
    """Tiles differing in rows, columns, warps, stages and descriptor loads but not in BK,
    slices or SWAP_AB launch the same K loop (the GPU test below asserts the bits)."""
    torch.manual_seed(17)
    x = torch.randn(40, 256, dtype=torch.bfloat16)
    w = torch.randn(48, 256, dtype=torch.bfloat16) * 0.05
    tiles = [
        SkinnyGemmConfig(BM=16, BN=16, BK=64, SPLIT_K=2, SWAP_AB=swap_ab),
        SkinnyGemmConfig(BM=32, BN=32, BK=64, SPLIT_K=2, SWAP_AB=swap_ab, num_stages=2, TMA=True),
        SkinnyGemmConfig(BM=64, BN=16, BK=64, SPLIT_K=2, SWAP_AB=swap_ab, num_warps=8),
    ]
    recorder = record_launches(skinny_gemm_module, "_skinny_gemm_kernel")
    outs = [skinny_gemm(x, w, tile) for tile in tiles]
    for out in outs:
        assert_close(out, linear_ref(x, w))
    loops = {(launch.kwargs["BK"], launch.kwargs["SPLIT_K"], launch.kwargs["SWAP_AB"],
              launch.ints[2], launch.ints[3]) for launch in recorder.launches}  # fmt: skip
    assert loops == {(64, 2, swap_ab, 256, 128)}


def test_decode_tiles_grow_with_the_batch_for_16_bit_weights():
    tile = invariant.decode_tile_rows
    bf16 = torch.bfloat16
    assert [tile(m, bf16) for m in (1, 16, 17, 32, 33, 64, 256)] == [16, 16, 32, 32, 64, 64, 64]
    assert {tile(m, torch.float32) for m in (1, 33, 256)} == {16}


@pytest.mark.gpu
@pytest.mark.parametrize(("n", "k"), _MODEL_SHAPES)
def test_decode_tiles_give_a_row_the_same_bits(n, k):
    """Each tile the decode phase can pick for a weight gives every row, at every row count
    from 1 to 256, the bits of the 256-row decode launch: the claim that a row's sums depend on
    the K plan alone, not on rows, columns, warps, stages or descriptor loads."""
    torch.manual_seed(16)
    x = torch.randn(256, k, device="cuda", dtype=torch.bfloat16)
    w = torch.randn(n, k, device="cuda", dtype=torch.bfloat16) * 0.02
    full = invariant_linear(x, w, "decode")
    for rows in invariant.DECODE_TILE_ROWS:
        config = decode_config(n, k, torch.bfloat16, rows)
        for m in range(1, 257):
            out = skinny_gemm(x[:m], w, config)
            assert torch.equal(out, full[:m]), (rows, m)
    torch.testing.assert_close(full.float(), linear_ref(x, w).float(), atol=2e-2, rtol=2e-2)


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
    measured = shape_table.lookup(8, 16384, 5120, bf16)
    assert measured is not None  # the GDN projection's tile beat cuBLAS at 8 rows
    assert shape_table.lookup(8, 16384 + 96, 5120, bf16) == measured  # + the b and a gate rows
    one_row = shape_table.decode_entry(16384, 5120, bf16)
    assert one_row is not None and shape_table.decode_entry(16384 + 96, 5120, bf16) == one_row
    assert shape_table.lookup(64, 10240 + 40, 5120, bf16) is None  # cuBLAS won at 64 rows
    assert shape_table.lookup(8, 16384 + 400, 5120, bf16) is None  # beyond 1%: unmeasured
    assert shape_table.lookup(8, 16384 + 96, 4096, bf16) is None  # K must match


def test_one_row_tiles_stay_for_the_invariant_mode_where_another_kernel_won():
    bf16 = torch.bfloat16
    for n, k in [(34816, 5120), (5120, 6144)]:  # the GEMV won the one row
        assert shape_table.gemv_lookup(n, k, bf16) is not None
        assert shape_table.decode_entry(n, k, bf16) is not None
    assert shape_table.lookup(1, 10240, 5120, bf16) is None  # cuBLAS won the one row
    assert shape_table.decode_entry(10240, 5120, bf16) is None  # no skinny tile was kept there
