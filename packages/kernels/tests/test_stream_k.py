"""The stream-K skinny GEMM against the fp32 reference and the tiled kernel's sums."""

import dataclasses
import importlib
import itertools

import pytest
import torch
from sparkinfer.kernels.linear import SkinnyGemmConfig, linear_ref, skinny_gemm
from sparkinfer.kernels.linear.stream_k import stream_k_gemm, stream_k_plan

# The module, not the function the package exports under the same name.
arrival_module = importlib.import_module("sparkinfer.kernels.linear._arrival")


def _k_order_sum(x: torch.Tensor, w: torch.Tensor, bn: int, bk: int, per_program: int):
    """y as the stream-K kernel sums it: per column tile, each program's K range accumulated in
    fp32, the ranges added in K order."""
    num_k = -(-x.shape[1] // bk)
    y = torch.zeros(x.shape[0], w.shape[0])
    for i_n in range(-(-w.shape[0] // bn)):
        cols = slice(i_n * bn, (i_n + 1) * bn)
        first, last = i_n * num_k, (i_n + 1) * num_k  # the tile's iterations
        cuts = [first] + [c for c in range(first + 1, last) if c % per_program == 0] + [last]
        for a, b in itertools.pairwise(cuts):
            ks = slice((a - first) * bk, (b - first) * bk)
            y[:, cols] += (x[:, ks].double() @ w[cols, ks].double().T).float()
    return y


@pytest.mark.parametrize(
    ("m", "n", "k", "programs_per_sm"),
    [(5, 40, 384, 1), (3, 70, 200, 2), (16, 64, 512, 3), (1, 33, 100, 1), (7, 48, 96, 8)],
)
@pytest.mark.parametrize("use_tma", [False, True], ids=["pointer", "tma"])
def test_stream_k_matches_ref_and_resets_the_counters(m, n, k, programs_per_sm, use_tma):
    # fp32: the interpreter's descriptors do not take bf16. Ranges cross tile boundaries, start
    # and end inside tiles, and (7 x 48 x 96 over 64 programs) cover one K step each.
    torch.manual_seed(m * n + k)
    x, w = torch.randn(m, k), torch.randn(n, k)
    bn, bk = 16, 32
    _, per_program = stream_k_plan(m, n, k, bn, bk, programs_per_sm * 8)
    for _ in range(2):  # the second launch reuses the counters the first left at zero
        y = stream_k_gemm(x, w, bn=bn, bk=bk, programs_per_sm=programs_per_sm, use_tma=use_tma)
        torch.testing.assert_close(y, x @ w.T, atol=2e-4, rtol=2e-4)
        torch.testing.assert_close(y, _k_order_sum(x, w, bn, bk, per_program), atol=1e-5, rtol=0)
    counters = arrival_module._arrival_counters[(x.device, 0)]
    assert int(counters.count_nonzero()) == 0


def test_stream_k_plan_covers_every_iteration_in_equal_ranges():
    for n, k, programs in [(5120, 17408, 264), (34816, 5120, 132), (40, 384, 8), (16, 32, 100)]:
        count, per_program = stream_k_plan(8, n, k, 64, 128, programs)
        total = -(-n // 64) * -(-k // 128)
        assert count <= programs and count * per_program >= total
        assert (count - 1) * per_program < total  # no program without work


def test_skinny_gemm_runs_stream_k_configs_and_keeps_the_tiled_kernel_otherwise():
    torch.manual_seed(5)
    x, w = torch.randn(6, 256), torch.randn(80, 256)
    config = SkinnyGemmConfig(BN=16, BK=32, SWAP_AB=True, STREAM_K=2)
    direct = stream_k_gemm(x, w, bn=16, bk=32, programs_per_sm=2, use_tma=False)
    assert torch.equal(skinny_gemm(x, w, config), direct)
    # A set BM (the batch-invariant tiles) and more than 64 rows take the tiled kernel.
    fixed = dataclasses.replace(config, BM=16)
    tiled = skinny_gemm(x, w, dataclasses.replace(fixed, STREAM_K=0))
    assert torch.equal(skinny_gemm(x, w, fixed), tiled)
    tall = torch.randn(70, 256)
    torch.testing.assert_close(skinny_gemm(tall, w, config), tall @ w.T, atol=2e-4, rtol=2e-4)


def test_stream_k_rejects_more_than_one_row_tile():
    with pytest.raises(ValueError, match="at most 64"):
        stream_k_gemm(torch.randn(65, 32), torch.randn(16, 32), bn=16, bk=32, programs_per_sm=1)


CUDA_ONLY = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


@pytest.mark.gpu
@CUDA_ONLY
@pytest.mark.parametrize("m", [8, 32])
@pytest.mark.parametrize(("n", "k"), [(5120, 17408), (34816, 5120), (5120, 6144)])
def test_stream_k_real_shapes_in_cuda_graphs_on_gpu(m, n, k, assert_close):
    torch.manual_seed(n + m)
    x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
    w = torch.randn(n, k, device="cuda", dtype=torch.bfloat16) * 0.02
    config = SkinnyGemmConfig(BN=64, BK=128, num_stages=4, SWAP_AB=True, TMA=True, STREAM_K=2)
    stream = torch.cuda.Stream()
    with torch.cuda.stream(stream):
        eager = skinny_gemm(x, w, config)  # warm-up on the capture stream makes its counters
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, stream=stream):
            out = skinny_gemm(x, w, config)
    assert_close(eager, linear_ref(x, w))
    for _ in range(3):
        graph.replay()
        torch.cuda.synchronize()
        assert torch.equal(out, eager)
