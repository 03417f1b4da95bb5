"""FP8 block-scaled GEMMs (decode and prompt) and the quantizers against the plain-torch
references, under the Triton interpreter at small shapes.

Tolerances, not bits, for the GEMMs: under the interpreter tl.dot is numpy's matmul. The
activation quantizer rounds to e4m3 on the bits (the interpreter's own e4m3 cast drops the carry
into the exponent), so it matches torch's cast exactly.
"""

import inspect

import pytest
import torch
from sparkinfer.kernels.fp8_linear import (
    FP8_DTYPE,
    Fp8DecodeConfig,
    Fp8GemvConfig,
    Fp8PromptConfig,
    Fp8Route,
    Fp8SwapAbConfig,
    cublas_accepts,
    dequantize_weight_fp8,
    fp8_gemm_cublas,
    fp8_gemm_decode,
    fp8_gemm_prompt,
    fp8_gemm_swap_ab,
    fp8_gemv,
    fp8_kernel_for,
    fp8_linear,
    fp8_linear_prompt_ref,
    fp8_linear_ref,
    quantize_activation_fp8,
    quantize_activation_fp8_ref,
    quantize_weight_fp8,
)
from sparkinfer.kernels.fp8_linear.routes import route_for
from sparkinfer.kernels.fp8_linear.tiles import (
    DECODE_TILES,
    GEMV_TILES,
    SWAP_AB_TILES,
    decode_tile,
    gemv_tile,
    swap_ab_tile,
)
from sparkinfer.kernels.linear import batch_invariant
from sparkinfer.kernels.tuning import KernelTuning, kernel_tuning

BF16_TOL = {"atol": 5e-2, "rtol": 2e-2}  # the interpreter truncates the final bf16 cast
# e4m3 has 3 mantissa bits: a quantized value is within 2^-4 of its magnitude (round to nearest)
E4M3_REL = 2.0**-4


def _weight(n: int, k: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    torch.manual_seed(seed)
    w = torch.randn(n, k) * 0.05
    w[: min(n, 3)] *= 20  # blocks of very different magnitudes
    return quantize_weight_fp8(w)


def test_the_references_share_the_signature_of_fp8_linear():
    assert inspect.signature(fp8_linear_ref) == inspect.signature(fp8_linear)
    assert inspect.signature(fp8_linear_prompt_ref) == inspect.signature(fp8_linear)


@pytest.mark.parametrize(("n", "k"), [(1, 1), (127, 129), (128, 128), (130, 300)])
def test_quantize_weight_round_trips_each_block_within_e4m3(n, k):
    torch.manual_seed(n + k)
    w = torch.randn(n, k)
    q, scale = quantize_weight_fp8(w)
    assert q.dtype == FP8_DTYPE and q.shape == (n, k)
    assert scale.shape == (-(-n // 128), -(-k // 128)) and scale.dtype == torch.float32
    back = dequantize_weight_fp8(q, scale)
    bound = E4M3_REL * w.abs() + scale.max() * 2.0**-9  # subnormals: absolute step
    assert ((back - w).abs() <= bound).all()
    assert (scale == w.abs().amax() / 448).any() or n * k > 128 * 128  # one block: its amax


def test_per_row_scales_encode_the_same_weight(assert_same_bits):
    q, scale = _weight(200, 256, 1)
    per_row = scale.repeat_interleave(128, dim=0)[:200].contiguous()
    assert_same_bits(dequantize_weight_fp8(q, per_row), dequantize_weight_fp8(q, scale))
    with pytest.raises(ValueError, match="weight_scale_inv has shape"):
        dequantize_weight_fp8(q, scale[:1])


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("m", [1, 16, 17, 40])
def test_decode_gemm_matches_ref(m, dtype, assert_close):
    w, s = _weight(150, 272, 2 + m)  # partial edge blocks on both sides
    x = torch.randn(m, 272).to(dtype)
    y = fp8_gemm_decode(x, w, s, Fp8DecodeConfig(BN=32, BK=64))
    expected = fp8_linear_ref(x, w, s)
    if dtype == torch.bfloat16:
        torch.testing.assert_close(y.float(), expected.float(), **BF16_TOL)
    else:
        assert_close(y, expected)


@pytest.mark.parametrize("bk", [64, 256])
def test_gemv_matches_ref_with_block_and_per_row_scales(bk, assert_close):  # tile over 2 blocks
    w, s = _weight(150, 300, 12)  # partial edge blocks on both sides
    x = torch.randn(1, 300)
    cfg = Fp8GemvConfig(BN=8, BK=bk)
    assert_close(fp8_gemv(x, w, s, cfg), fp8_linear_ref(x, w, s))
    per_row = s.repeat_interleave(128, dim=0)[:150].contiguous()
    assert_close(fp8_gemv(x, w, per_row, cfg), fp8_linear_ref(x, w, s))
    with pytest.raises(ValueError, match="one row"):
        fp8_gemv(torch.randn(2, 300), w, s)


def test_decode_gemm_per_row_scales_and_strided_rows(assert_close):
    w, s = _weight(96, 130, 3)
    per_row = s.repeat_interleave(128, dim=0)[:96].contiguous()
    x = torch.randn(5, 400)[:, :130]
    assert_close(fp8_gemm_decode(x, w, per_row, Fp8DecodeConfig(BN=16)), fp8_linear_ref(x, w, s))


def test_the_quantizer_shares_the_signature_of_its_reference():
    assert inspect.signature(quantize_activation_fp8) == inspect.signature(
        quantize_activation_fp8_ref
    )


@pytest.mark.parametrize(("m", "k", "row_multiple"), [(7, 300, 1), (1, 256, 16), (18, 130, 16)])
def test_activation_quantization_matches_ref(m, k, row_multiple, assert_same_bits):
    x = torch.randn(m, k) * torch.rand(m, 1) * 10  # fresh inputs: rows of varied magnitude
    x[0, :7] = torch.tensor([0.0, 448.0, -1e-9, 127.9, 3.0e4, -6.1e-5, 0.5])  # e4m3 edges
    q, scale = quantize_activation_fp8(x, row_multiple)
    q_ref, scale_ref = quantize_activation_fp8_ref(x, row_multiple)
    rows = -(-m // row_multiple) * row_multiple
    assert q.shape == q_ref.shape == (rows, k)
    assert scale.shape == (rows, -(-k // 128)) and scale.stride() == scale_ref.stride()
    assert scale.stride(0) == 1  # outer-dim major: the layout cuBLAS's 1x128 blocks read
    assert_same_bits(scale, scale_ref)  # max-abs and a division: no order to round in
    assert_same_bits(q.float(), q_ref.float())  # the kernel rounds on the bits, as torch
    assert not q[m:].float().any()  # padding rows are zero


def test_the_swap_ab_gemm_shares_the_signature_of_the_decode_gemm():
    sig = inspect.signature(fp8_gemm_swap_ab)
    assert list(sig.parameters) == [*inspect.signature(fp8_gemm_decode).parameters, "x_fp8"]


@pytest.mark.parametrize(("m", "split_k"), [(1, 1), (5, 3), (17, 1), (16, 2)])
def test_swap_ab_gemm_matches_the_prompt_ref(m, split_k, assert_same_bits):
    w, s = _weight(150, 600, 14 + m)  # 5 scale blocks, partial edge blocks: uneven slices
    x = torch.randn(m, 600) * torch.rand(m, 1) * 4
    cfg = Fp8SwapAbConfig(BN=64, SPLIT_K=split_k)
    y = fp8_gemm_swap_ab(x, w, s, cfg)
    torch.testing.assert_close(y, fp8_linear_prompt_ref(x, w, s), atol=2e-3, rtol=2e-3)
    per_row = s.repeat_interleave(128, dim=0)[:150].contiguous()
    torch.testing.assert_close(fp8_gemm_swap_ab(x, w, per_row, cfg), y, atol=2e-3, rtol=2e-3)
    if split_k > 1:
        assert_same_bits(fp8_gemm_swap_ab(x, w, s, cfg), y)  # slice order, not finish order
    pre = Fp8SwapAbConfig(BN=64, SPLIT_K=split_k, PREQUANTIZE=True)  # x quantized before
    torch.testing.assert_close(fp8_gemm_swap_ab(x, w, s, pre), y, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize(
    ("tma", "fold", "persistent"),
    [(False, False, False), (True, False, False), (True, True, False), (False, True, True)],
)
@pytest.mark.parametrize("m", [1, 33, 70])
def test_prompt_gemm_matches_ref(m, tma, fold, persistent, assert_close):
    w, s = _weight(136, 260, 5 + m)
    torch.manual_seed(m)
    x = torch.randn(m, 260)
    cfg = Fp8PromptConfig(BM=32, BN=32, GROUP_M=2, TMA=tma, FOLD_SCALES=fold,
                          PERSISTENT=persistent)  # fmt: skip
    y = fp8_gemm_prompt(x, w, s, cfg)
    torch.testing.assert_close(y, fp8_linear_prompt_ref(x, w, s), atol=2e-2, rtol=2e-2)
    # and near the unquantized-activation product: e4m3 activations lose up to 2^-4 per element
    exact = fp8_linear_ref(x, w, s)
    assert (y - exact).norm() <= 0.1 * exact.norm()


def test_dispatch_follows_the_routes(monkeypatch):
    from sparkinfer.kernels.fp8_linear import dispatch

    calls = []
    for name, kind in [("fp8_gemv", "g"), ("fp8_gemm_decode", "d"), ("fp8_gemm_prompt", "p"),
                       ("fp8_gemm_swap_ab", "a")]:  # fmt: skip
        monkeypatch.setattr(
            dispatch, name, lambda x, w, s, c=None, k=kind, **_: calls.append((k, c))
        )
    w, s = _weight(8, 128, 6)
    for m in (1, 32, 33, 65):  # CPU x: no cuBLAS, so the decode then the prompt GEMM
        fp8_linear(torch.randn(m, 128), w, s)
    routes = (Fp8Route("gemv", 1), Fp8Route("decode", 8), Fp8Route("prompt"))
    with kernel_tuning(KernelTuning(fp8_routes=routes)):
        for m in (1, 8, 9):
            fp8_linear(torch.randn(m, 128), w, s)
    kinds = [kind for kind, _ in calls]
    assert kinds == ["a", "a", "d", "p", "g", "d", "p"]  # batch-invariant: its own test file
    assert calls[0][1] == swap_ab_tile(1, 8, 128) and calls[2][1] == decode_tile(33, 8, 128)
    assert calls[4][1] == gemv_tile(8, 128)


def test_routes_pick_the_first_route_holding_the_rows():
    routes = (Fp8Route("gemv", 1), Fp8Route("swap_ab", 16), Fp8Route("cublas"))
    assert [route_for(routes, m) for m in (1, 2, 16, 17, 4096)] == [
        "gemv",
        "swap_ab",
        "swap_ab",
        "cublas",
        "cublas",
    ]
    with pytest.raises(ValueError, match="max_rows None"):
        route_for(routes[:2], 17)


def test_fp8_kernel_for_reads_the_tuning_routes_and_keeps_invariant_kernels():
    w, s = _weight(256, 512, 15)
    x = torch.randn(8, 512)
    routes = (Fp8Route("swap_ab", 8), Fp8Route("prompt"))
    with kernel_tuning(KernelTuning(fp8_routes=routes)):
        assert fp8_kernel_for(x, w, s) == "swap_ab"
        assert fp8_kernel_for(torch.randn(9, 512), w, s) == "prompt"
        with batch_invariant("decode"):
            assert fp8_kernel_for(x, w, s) == "swap_ab"  # never cuBLAS nor the routes
        with batch_invariant("prefill"):
            assert fp8_kernel_for(x, w, s) == "prompt"
    cublas_routes = (Fp8Route("cublas"),)
    with kernel_tuning(KernelTuning(fp8_routes=cublas_routes)):  # CPU x: no cuBLAS
        assert fp8_kernel_for(x, w, s) == "decode"
        assert fp8_kernel_for(torch.randn(65, 512), w, s) == "prompt"


def test_cublas_takes_only_the_operands_it_can_read():
    w, s = _weight(256, 512, 16)
    x = torch.randn(4, 512, dtype=torch.bfloat16)
    assert not cublas_accepts(x, w, s)  # a CPU x
    per_row = s.repeat_interleave(128, dim=0).contiguous()
    with pytest.raises(ValueError, match="use fp8_linear"):
        fp8_gemm_cublas(x, w, per_row)


def test_tile_table_splits_k_only_for_narrow_weights():
    wide, narrow = gemv_tile(16384, 5120), gemv_tile(5120, 17408)
    assert wide.SPLIT_K == 1 and narrow.SPLIT_K > 1
    assert decode_tile(8, 34816, 5120).SPLIT_K == 1 and decode_tile(8, 5120, 6144).SPLIT_K > 1
    assert swap_ab_tile(1, 34816, 5120).SPLIT_K == 1 and swap_ab_tile(1, 5120, 6144).SPLIT_K > 1
    for rules in (
        GEMV_TILES,
        DECODE_TILES,
        SWAP_AB_TILES,
    ):  # a catch-all last rule: every shape has a tile
        assert rules[-1].max_n is None and rules[-1].min_k == 0 and rules[-1].max_rows is None


@pytest.mark.parametrize("split_k", [2, 3])
def test_split_k_matches_ref_and_is_deterministic(split_k, assert_close, assert_same_bits):
    w, s = _weight(150, 600, 13)  # 5 scale blocks, partial edge blocks: uneven slices
    x = torch.randn(3, 600)
    g_cfg = Fp8GemvConfig(BN=16, BK=128, SPLIT_K=split_k)
    y = fp8_gemv(x[:1], w, s, g_cfg)
    assert_close(y, fp8_linear_ref(x[:1], w, s))
    assert_same_bits(y, fp8_gemv(x[:1], w, s, g_cfg))
    d_cfg = Fp8DecodeConfig(BN=32, BK=64, SPLIT_K=split_k)
    assert_close(fp8_gemm_decode(x, w, s, d_cfg), fp8_linear_ref(x, w, s))


def test_launchers_refuse_bad_operands():
    w, s = _weight(8, 128, 7)
    with pytest.raises(TypeError, match="float8_e4m3fn"):
        fp8_gemm_decode(torch.randn(1, 128), w.float(), s)
    with pytest.raises(ValueError, match="K=64"):
        fp8_gemm_decode(torch.randn(1, 64), w, s)
    with pytest.raises(TypeError, match="fp32"):
        fp8_gemm_prompt(torch.randn(1, 128), w, s.double())
    with pytest.raises(ValueError, match="BK is 96"):
        fp8_gemm_decode(torch.randn(1, 128), w, s, Fp8DecodeConfig(BK=96))


@pytest.mark.gpu
@pytest.mark.parametrize("m", [1, 8, 16, 32, 64, 512])
@pytest.mark.parametrize(("n", "k"), [(16480, 5120), (5120, 17408), (34816, 5120)])
def test_fp8_linear_real_shapes_on_gpu(m, n, k):
    torch.manual_seed(8)
    w, s = quantize_weight_fp8(torch.randn(n, k, device="cuda") * 0.02)
    x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
    is_quantized = fp8_kernel_for(x, w, s) in ("swap_ab", "cublas", "prompt")  # e4m3 x
    ref = fp8_linear_prompt_ref if is_quantized else fp8_linear_ref
    torch.testing.assert_close(fp8_linear(x, w, s).float(), ref(x, w, s).float(), atol=3e-2,
                               rtol=3e-2)  # fmt: skip


@pytest.mark.gpu
@pytest.mark.parametrize("m", [1, 8, 32])
def test_split_k_tiles_are_deterministic_and_close_on_gpu(m):
    torch.manual_seed(10)
    w, s = quantize_weight_fp8(torch.randn(5120, 17408, device="cuda") * 0.02)
    x = torch.randn(m, 17408, device="cuda", dtype=torch.bfloat16)
    fn, cfg = (fp8_gemv, gemv_tile(5120, 17408)) if m == 1 else (
        fp8_gemm_decode, decode_tile(m, 5120, 17408))  # fmt: skip
    assert cfg.SPLIT_K > 1
    y = fn(x, w, s, cfg)
    for _ in range(3):  # the slices' finishing order varies; the sum order does not
        assert torch.equal(fn(x, w, s, cfg), y)
    torch.testing.assert_close(y.float(), fp8_linear_ref(x, w, s).float(), atol=3e-2, rtol=3e-2)


@pytest.mark.gpu
@pytest.mark.parametrize("m", [8, 32])
def test_decode_bf16_bits_conversion_gives_the_same_bits_on_gpu(m):
    torch.manual_seed(11)
    w, s = quantize_weight_fp8(torch.randn(4096, 1024, device="cuda") * 0.02)
    every_byte = torch.arange(256, device="cuda", dtype=torch.uint8).view(FP8_DTYPE)
    w[:2] = every_byte.repeat(8).view(2, 1024)
    w[:2].view(torch.uint8)[(w[:2].view(torch.uint8) & 0x7F) == 0x7F] = 0  # no NaN weights
    x = torch.randn(m, 1024, device="cuda", dtype=torch.bfloat16)
    plain = fp8_gemm_decode(x, w, s, Fp8DecodeConfig(BN=32))
    assert torch.equal(fp8_gemm_decode(x, w, s, Fp8DecodeConfig(BN=32, BF16_BITS=True)), plain)


@pytest.mark.gpu
@pytest.mark.parametrize("m", [1, 16, 32])
def test_swap_ab_as_a_dependent_with_prefetch_gives_the_same_bits_on_gpu(m):
    torch.manual_seed(m)
    w, s = quantize_weight_fp8(torch.randn(16384, 5120, device="cuda") * 0.02)
    x = torch.randn(m, 5120, device="cuda", dtype=torch.bfloat16)
    plain = Fp8SwapAbConfig(SPLIT_K=2)
    early = Fp8SwapAbConfig(SPLIT_K=2, DEPENDENT=True, PREFETCH=2)
    first = fp8_gemm_swap_ab(x, w, s, plain)
    torch.cuda.synchronize()
    for _ in range(3):  # each launch after the last: its prefetch overlaps that one's tail
        assert torch.equal(fp8_gemm_swap_ab(x, w, s, early), first)


@pytest.mark.gpu
@pytest.mark.parametrize(("n", "k", "split_k"), [(16384, 5120, 1), (5120, 17408, 4)])
def test_gemv_bf16_bits_conversion_gives_the_same_bits_on_gpu(n, k, split_k):
    torch.manual_seed(n + k)
    w, s = quantize_weight_fp8(torch.randn(n, k, device="cuda") * 0.02)
    x = torch.randn(1, k, device="cuda", dtype=torch.bfloat16)
    plain = Fp8GemvConfig(BN=32, SPLIT_K=split_k)
    bits = Fp8GemvConfig(BN=32, SPLIT_K=split_k, BF16_BITS=True)
    assert torch.equal(fp8_gemv(x, w, s, bits), fp8_gemv(x, w, s, plain))


@pytest.mark.gpu
@pytest.mark.parametrize("m", [1, 3, 16, 40, 4096])
def test_cublas_and_swap_ab_match_the_prompt_ref_on_gpu(m):
    torch.manual_seed(12)
    w, s = quantize_weight_fp8(torch.randn(5120, 6144, device="cuda") * 0.02)
    x = torch.randn(m, 6144, device="cuda", dtype=torch.bfloat16)
    ref = fp8_linear_prompt_ref(x, w, s).float()
    assert cublas_accepts(x, w, s)
    torch.testing.assert_close(fp8_gemm_cublas(x, w, s).float(), ref, atol=3e-2, rtol=3e-2)
    if m <= 64:
        y = fp8_gemm_swap_ab(x, w, s, Fp8SwapAbConfig(SPLIT_K=4))
        torch.testing.assert_close(y.float(), ref, atol=3e-2, rtol=3e-2)
        pre = fp8_gemm_swap_ab(x, w, s, Fp8SwapAbConfig(SPLIT_K=4, PREQUANTIZE=True))
        assert torch.equal(pre, y)  # the same e4m3 x and scales, the same dots


@pytest.mark.gpu
def test_activation_quantization_matches_ref_on_gpu():
    torch.manual_seed(13)
    x = torch.randn(300, 5120, device="cuda", dtype=torch.bfloat16) * 3
    q, scale = quantize_activation_fp8(x, 16)
    q_ref, scale_ref = quantize_activation_fp8_ref(x, 16)
    torch.testing.assert_close(scale, scale_ref, rtol=0, atol=0)
    assert torch.equal(q.float(), q_ref.float())
