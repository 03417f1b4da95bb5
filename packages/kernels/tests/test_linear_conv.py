"""The causal conv's decode step in the epilogue of the in_proj GEMMs (GEMV and skinny GEMM): the
same bits and the same windows as the projection then `causal_conv1d_update`."""

import inspect

import pytest
import torch
from sparkinfer.kernels.causal_conv1d import causal_conv1d_update
from sparkinfer.kernels.linear import (
    GemvConfig,
    SkinnyGemmConfig,
    batch_invariant,
    gemv,
    linear,
    linear_conv_update,
    linear_conv_update_ref,
    skinny_gemm,
)
from sparkinfer.kernels.linear._checks import ConvUpdate

W = 4


def _operands(m: int, n: int, k: int, channels: int, num_slots: int, dtype, device="cpu"):
    x = torch.randn(m, k, dtype=dtype, device=device)
    weight = (torch.randn(n, k, device=device) * k**-0.5).to(dtype)
    conv_weight = (torch.randn(channels, W, device=device) * 0.5).to(dtype)
    state = torch.randn(num_slots, W - 1, channels, device=device).to(dtype)
    return x, weight, conv_weight, state


def _unfused(project, x, weight, conv_weight, state, slots):
    """The projection, then the conv's update kernel on its first columns."""
    y = project(x, weight)
    channels = conv_weight.shape[0]
    y[:, :channels] = causal_conv1d_update(y[:, :channels], conv_weight, state, state_slots=slots)
    return y


def test_linear_conv_update_shares_its_reference_signature():
    assert inspect.signature(linear_conv_update) == inspect.signature(linear_conv_update_ref)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("slot", [2, -1])
def test_gemv_conv_epilogue_equals_gemv_then_conv_update(dtype, slot):
    torch.manual_seed(5)
    # 44 columns in tiles of 8: the conv's 20 end inside a tile, and whole tiles follow it.
    x, weight, conv_weight, state = _operands(1, 44, 96, 20, 4, dtype)
    slots = torch.tensor([slot])
    config = GemvConfig(BN=8, BK=32)
    state_fused = state.clone()
    fused = gemv(x, weight, config, conv=ConvUpdate(conv_weight, state_fused, slots))
    expected = _unfused(lambda a, b: gemv(a, b, config), x, weight, conv_weight, state, slots)
    assert torch.equal(fused, expected)
    assert torch.equal(state_fused, state)
    if slot < 0:
        assert not fused[:, :20].any()


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("swap_ab", [False, True])
def test_skinny_conv_epilogue_equals_gemm_then_conv_update(dtype, swap_ab):
    torch.manual_seed(6)
    x, weight, conv_weight, state = _operands(5, 72, 64, 40, 6, dtype)
    slots = torch.tensor([3, -1, 0, 5, 1])  # one padding row, slots out of order
    config = SkinnyGemmConfig(BN=16, BK=32, SWAP_AB=swap_ab)
    state_fused = state.clone()
    fused = skinny_gemm(x, weight, config, conv=ConvUpdate(conv_weight, state_fused, slots))
    project = lambda a, b: skinny_gemm(a, b, config)
    expected = _unfused(project, x, weight, conv_weight, state, slots)
    assert torch.equal(fused, expected)
    assert torch.equal(state_fused, state)
    assert not fused[1, :40].any()


def test_linear_conv_update_on_cpu_is_the_reference(assert_close):
    torch.manual_seed(7)
    x, weight, conv_weight, state = _operands(3, 40, 32, 24, 3, torch.float32)
    slots = torch.tensor([2, 0, -1])
    state_ref = state.clone()
    y = linear_conv_update(x, weight, conv_weight, state, state_slots=slots)
    assert_close(y, linear_conv_update_ref(x, weight, conv_weight, state_ref, state_slots=slots))
    assert_close(state, state_ref)


def test_conv_epilogue_rejects_what_it_cannot_do():
    x, weight, conv_weight, state = _operands(2, 32, 64, 16, 2, torch.float32)
    slots = torch.tensor([0, 1])
    conv = ConvUpdate(conv_weight, state, slots)
    with pytest.raises(ValueError, match="one K slice"):
        skinny_gemm(x, weight, SkinnyGemmConfig(BN=16, BK=16, SPLIT_K=2), conv=conv)
    with pytest.raises(ValueError, match="cannot share an epilogue"):
        skinny_gemm(x, torch.randn(32, 64), SkinnyGemmConfig(BN=16, BK=16), swiglu=True, conv=conv)
    with pytest.raises(ValueError, match="widths"):
        wide = ConvUpdate(torch.randn(16, 5), torch.randn(2, 4, 16), slots)
        skinny_gemm(x, weight, SkinnyGemmConfig(BN=16, BK=16), conv=wide)
    with pytest.raises(ValueError, match="columns"):
        narrow = ConvUpdate(torch.randn(48, W), torch.randn(2, W - 1, 48), slots)
        skinny_gemm(x, weight, SkinnyGemmConfig(BN=16, BK=16), conv=narrow)
    with pytest.raises(ValueError, match="state_slots"):
        bad_slots = ConvUpdate(conv_weight, state, torch.tensor([0]))
        skinny_gemm(x, weight, SkinnyGemmConfig(BN=16, BK=16), conv=bad_slots)


CUDA_ONLY = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


@pytest.mark.gpu
@CUDA_ONLY
@pytest.mark.parametrize("phase", [None, "decode"])
@pytest.mark.parametrize("m", [1, 2, 8, 32, 64])
def test_linear_conv_update_real_shapes_on_gpu(phase, m):
    """GDN's in_proj at 27B shapes: the fused launch gives the bits of linear then the update."""
    torch.manual_seed(m)
    x, weight, conv_weight, state = _operands(m, 16480, 5120, 10240, 70, torch.bfloat16, "cuda")
    slots = torch.randperm(70, device="cuda")[:m]
    if m > 1:
        slots[1] = -1
    state_unfused = state.clone()
    with batch_invariant(phase) if phase else torch.no_grad():
        fused = linear_conv_update(x, weight, conv_weight, state, state_slots=slots)
        expected = _unfused(linear, x, weight, conv_weight, state_unfused, slots)
    assert torch.equal(fused, expected)
    assert torch.equal(state, state_unfused)
