"""The benchmark's cuBLASLt binding against F.linear."""

import pytest
import torch
import torch.nn.functional as F
from sparkinfer.lab.kernels._cublaslt import WORKSPACE_BYTES, LtMatmul


def test_rejects_dtypes_it_does_not_plan():
    with pytest.raises(TypeError, match="bf16 or fp16"):
        LtMatmul(8, 8, 8, torch.float32)


@pytest.mark.gpu
@pytest.mark.parametrize(("m", "n", "k"), [(1024, 384, 256), (1000, 640, 512)])
def test_each_offered_algorithm_gives_f_linears_result(m, n, k):
    torch.manual_seed(m + n)
    x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
    w = torch.randn(n, k, device="cuda", dtype=torch.bfloat16) * 0.05
    out = torch.empty(m, n, device="cuda", dtype=torch.bfloat16)
    workspace = torch.empty(WORKSPACE_BYTES, dtype=torch.uint8, device="cuda")
    plan = LtMatmul(m, n, k, torch.bfloat16)
    algos = plan.algos(4)
    assert algos and all(a.name for a in algos)
    expected = F.linear(x, w).float()
    for algo in algos:
        plan(x, w, out, algo, workspace)
        torch.testing.assert_close(out.float(), expected, atol=2e-2, rtol=2e-2)
