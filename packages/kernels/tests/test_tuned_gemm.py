"""TunedGemms: row buckets, fallbacks, and tuned launches with F.linear's bits."""

import pytest
import torch
import torch.nn.functional as F
from sparkinfer.kernels.linear import batch_invariant, linear
from sparkinfer.kernels.linear.tuned_gemm import TunedGemms


def test_row_buckets_are_powers_of_two_from_min_rows_then_the_budget():
    tuned = TunedGemms(torch.device("cpu"), min_rows=1024)
    assert tuned.row_buckets(8192) == [1024, 2048, 4096, 8192]
    assert tuned.row_buckets(6000) == [1024, 2048, 4096, 6000]
    assert tuned.row_buckets(1024) == [1024]
    assert tuned.row_buckets(512) == []
    with pytest.raises(ValueError, match="min_rows"):
        TunedGemms(torch.device("cpu"), min_rows=0)


def test_untuned_shapes_and_cpu_tensors_run_linear():
    tuned = TunedGemms(torch.device("cpu"), min_rows=4)
    x, w = torch.randn(8, 16), torch.randn(12, 16)
    assert tuned.choice(8, 12, 16, torch.float32) is None
    assert torch.equal(tuned.linear(x, w), linear(x, w))


@pytest.mark.gpu
def test_tuned_launches_give_f_linears_bits_at_and_between_buckets():
    torch.manual_seed(0)
    tuned = TunedGemms(torch.device("cuda"), min_rows=256)
    shapes = [(768, 512), (512, 1536)]
    results = tuned.tune(shapes, max_rows=1024, dtype=torch.bfloat16, iters=3)
    assert {(r.rows, r.n, r.k) for r in results} == {
        (rows, n, k) for rows in (256, 512, 1024) for n, k in shapes
    }
    assert all(r.best_ms <= r.linear_ms for r in results)
    for rows in (256, 300, 1024, 100, 2048):  # in buckets, between, below and above them
        for n, k in shapes:
            x = torch.randn(rows, k, device="cuda", dtype=torch.bfloat16)
            w = torch.randn(n, k, device="cuda", dtype=torch.bfloat16) * 0.05
            assert torch.equal(tuned.linear(x, w), F.linear(x, w))
            with batch_invariant("prefill"):
                assert torch.equal(tuned.linear(x, w), linear(x, w))
    x = torch.randn(512, 512, device="cuda", dtype=torch.bfloat16)
    w = torch.randn(2 * 384, 512, device="cuda", dtype=torch.bfloat16)
    gate, up = F.linear(x, w).float().chunk(2, dim=-1)
    torch.testing.assert_close(tuned.linear_swiglu(x, w).float(), F.silu(gate) * up,
                               atol=2e-2, rtol=2e-2)  # fmt: skip
