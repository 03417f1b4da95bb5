"""SwiGLU MLP: the fused activation + down projection keeps the unfused path's numerics."""

import pytest
import torch
import torch.nn.functional as F
from sparkinfer.kernels.activation import silu_and_mul, silu_and_mul_ref
from sparkinfer.kernels.linear import linear
from sparkinfer.model.layers import REFERENCE_OPS, KernelOps, triton_ops
from sparkinfer.model.layers.mlp import MLP


def _mlp(ops: KernelOps, dtype: torch.dtype) -> MLP:
    mlp = MLP(48, 80, ops=ops, device=torch.device("cpu"), dtype=dtype)
    with torch.no_grad():
        for p in mlp.parameters():
            p.copy_(torch.randn_like(p) * 0.2)
    return mlp


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("num_tokens", [1, 7, 70])
def test_reference_mlp_equals_silu_and_mul_then_down_proj(dtype, num_tokens):
    torch.manual_seed(num_tokens)
    mlp = _mlp(REFERENCE_OPS, dtype)
    x = torch.randn(num_tokens, 48, dtype=dtype)
    gate_up = F.linear(x, mlp.gate_up_proj.weight)
    unfused = F.linear(silu_and_mul_ref(gate_up), mlp.down_proj.weight)
    assert torch.equal(mlp(x), unfused)


def test_triton_mlp_equals_silu_and_mul_then_linear_on_cpu():
    torch.manual_seed(5)
    mlp = _mlp(triton_ops(), torch.float32)
    x = torch.randn(3, 48)
    gate_up = linear(x, mlp.gate_up_proj.weight)
    assert torch.equal(mlp(x), linear(silu_and_mul(gate_up), mlp.down_proj.weight))
