"""The batch-invariant FP8 kernels (`fp8_linear.invariant`): their tiles, the dispatch inside
`batch_invariant(phase)`, their products against the prompt reference under the interpreter, and
on the GPU a row's bits alone and among batches of every size and position."""

import dataclasses

import pytest
import torch
from sparkinfer.kernels.fp8_linear import (
    Fp8Activation,
    fp8_gemm_swap_ab,
    fp8_kernel_for,
    fp8_linear,
    fp8_linear_prompt_ref,
    invariant_fp8_linear,
    quantize_activation_fp8,
    quantize_weight_fp8,
)
from sparkinfer.kernels.fp8_linear.invariant import (
    INVARIANT_PROMPT_CONFIG,
    decode_row_tile_for,
    invariant_swap_ab_tile,
)
from sparkinfer.kernels.fp8_linear.tiles import swap_ab_tile
from sparkinfer.kernels.linear import batch_invariant
from sparkinfer.kernels.split_k import split_k_plan

# The 27B projections (GDN in_proj, attention qkv, gate_up, down, out_proj): every K plan of the
# tile table (8, 2 and 1 slices).
SHAPES_27B = ((16384, 5120), (14336, 5120), (34816, 5120), (5120, 17408), (5120, 6144))
ROW_COUNTS = (1, 2, 3, 4, 7, 8, 16, 33, 64, 100)


def _weight(n: int, k: int, seed: int, device: str = "cpu") -> tuple[torch.Tensor, torch.Tensor]:
    torch.manual_seed(seed)
    w = torch.randn(n, k, device=device) * 0.05
    w[: min(n, 3)] *= 20  # blocks of very different magnitudes
    return quantize_weight_fp8(w)


@pytest.mark.parametrize(("n", "k"), SHAPES_27B)
def test_the_decode_tile_keeps_one_k_plan_for_every_row_count(n, k):
    plan = split_k_plan(k, swap_ab_tile(1, n, k).SPLIT_K, 128)
    for m in range(1, 260):
        tile = invariant_swap_ab_tile(m, n, k)
        assert split_k_plan(k, tile.SPLIT_K, 128) == plan
        assert decode_row_tile_for(m) == tile.BM
        assert not tile.DEPENDENT  # one launch order, nothing else changes the sums


def test_the_prefill_tile_never_splits_k_and_is_the_prompt_route_tile():
    from sparkinfer.kernels.fp8_linear import dispatch

    assert dispatch.PROMPT_CONFIG == INVARIANT_PROMPT_CONFIG
    assert INVARIANT_PROMPT_CONFIG.BM == 128  # wgmma-sized row tiles; no K split field at all


def test_dispatch_runs_the_invariant_kernel_of_the_phase(monkeypatch):
    from sparkinfer.kernels.fp8_linear import invariant

    calls = []
    for name, kind in [("fp8_gemm_swap_ab", "a"), ("fp8_gemm_prompt", "p")]:
        monkeypatch.setattr(
            invariant, name, lambda x, w, s, c=None, k=kind, x_fp8=None: calls.append((k, c, x_fp8))
        )
    w, s = _weight(256, 512, 1)
    q = Fp8Activation(*quantize_activation_fp8(torch.randn(3, 512)))
    with batch_invariant("decode"):
        assert fp8_kernel_for(torch.randn(3, 512), w, s) == "swap_ab"
        fp8_linear(torch.randn(3, 512), w, s)
        fp8_linear(torch.randn(100, 512), w, s)
        fp8_linear(torch.randn(3, 512), w, s, x_fp8=q)
    with batch_invariant("prefill"):
        assert fp8_kernel_for(torch.randn(3, 512), w, s) == "prompt"
        fp8_linear(torch.randn(3, 512), w, s, x_fp8=q)
    assert [c[0] for c in calls] == ["a", "a", "a", "p"]
    assert calls[0][1] == invariant_swap_ab_tile(3, 256, 512)
    assert calls[1][1] == invariant_swap_ab_tile(100, 256, 512)
    assert calls[2][2] is q and calls[3][2] is q  # the norm's e4m3 x, not quantized again
    assert calls[3][1] == INVARIANT_PROMPT_CONFIG


@pytest.mark.parametrize("phase", ["decode", "prefill"])
@pytest.mark.parametrize("m", [1, 5, 17, 40])
def test_invariant_kernels_match_the_prompt_ref(phase, m):
    w, s = _weight(200, 640, 2 + m)  # partial edge blocks along N
    x = torch.randn(m, 640) * torch.rand(m, 1) * 4
    ref = fp8_linear_prompt_ref(x, w, s)
    y = invariant_fp8_linear(x, w, s, phase)
    torch.testing.assert_close(y, ref, atol=2e-3, rtol=2e-3)
    q = Fp8Activation(*quantize_activation_fp8(x, 16))  # padded rows, as the norm gives them
    torch.testing.assert_close(invariant_fp8_linear(x, w, s, phase, x_fp8=q), y, atol=1e-5,
                               rtol=1e-5)  # fmt: skip


@pytest.mark.parametrize("phase", ["decode", "prefill"])
def test_a_row_stays_within_rounding_across_batches_under_the_interpreter(phase, assert_close):
    w, s = _weight(136, 384, 3)
    x = torch.randn(40, 384)
    full = invariant_fp8_linear(x, w, s, phase)
    for start, stop in [(0, 1), (5, 6), (3, 20), (7, 40)]:  # bits: the gpu test below
        assert_close(invariant_fp8_linear(x[start:stop], w, s, phase), full[start:stop])


@pytest.mark.gpu
@pytest.mark.parametrize("phase", ["decode", "prefill"])
@pytest.mark.parametrize(("n", "k"), SHAPES_27B)
def test_invariant_rows_do_not_depend_on_the_batch_on_gpu(phase, n, k):
    w, s = _weight(n, k, n + k, "cuda")
    total = 2 * max(ROW_COUNTS) + 17
    x = torch.randn(total, k, device="cuda", dtype=torch.bfloat16) * 2
    with batch_invariant(phase):
        full = fp8_linear(x, w, s)
        for m in ROW_COUNTS:
            for start in (0, 1, 17, total - m):  # first, second, a middle and the last rows
                part = fp8_linear(x[start : start + m], w, s)
                assert torch.equal(part, full[start : start + m]), (phase, m, start)
    ref = fp8_linear_prompt_ref(x, w, s).float()
    torch.testing.assert_close(full.float(), ref, atol=3e-2, rtol=3e-2)


@pytest.mark.gpu
@pytest.mark.parametrize(("n", "k"), [(16384, 5120), (5120, 17408)])
def test_swap_ab_row_tiles_and_quantizers_give_a_row_the_same_bits_on_gpu(n, k):
    """What the decode route's invariance rests on: 16-, 32- and 64-row tiles, x quantized in
    registers or before the launch, each with the one K plan (if this fails, set
    `invariant.DECODE_ROW_TILES = (16,)`)."""
    w, s = _weight(n, k, 5, "cuda")
    x = torch.randn(64, k, device="cuda", dtype=torch.bfloat16)
    plan = invariant_swap_ab_tile(1, n, k)
    first = fp8_gemm_swap_ab(x, w, s, plan)
    for bm in (16, 32, 64):
        for prequantize in (False, True):
            tile = dataclasses.replace(plan, BM=bm, PREQUANTIZE=prequantize)
            assert torch.equal(fp8_gemm_swap_ab(x, w, s, tile), first), (bm, prequantize)


@pytest.mark.gpu
@pytest.mark.parametrize("phase", ["decode", "prefill"])
@pytest.mark.parametrize("m", [1, 16, 33, 100])
def test_invariant_rows_read_the_norms_e4m3_x_to_the_same_bits_on_gpu(phase, m):
    w, s = _weight(16384, 5120, m, "cuda")
    x = torch.randn(m, 5120, device="cuda", dtype=torch.bfloat16)
    q = Fp8Activation(*quantize_activation_fp8(x, 4))  # padded to 4 rows, as the norm pads
    with batch_invariant(phase):
        assert torch.equal(fp8_linear(x, w, s, x_fp8=q), fp8_linear(x, w, s))


@pytest.mark.gpu
def test_a_long_prompt_row_keeps_its_bits_on_gpu():
    w, s = _weight(5120, 6144, 4, "cuda")
    x = torch.randn(4096, 6144, device="cuda", dtype=torch.bfloat16)
    with batch_invariant("prefill"):
        full = fp8_linear(x, w, s)
        for start, stop in [(0, 1), (129, 130), (4000, 4096), (1000, 3000)]:
            assert torch.equal(fp8_linear(x[start:stop], w, s), full[start:stop])
