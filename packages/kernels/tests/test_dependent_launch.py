"""Programmatic dependent launch: off on the CPU and under the interpreter, switchable, and a
kernel that waits first still computes the same result when launched without it."""

import pytest
import torch
import triton
import triton.language as tl
from sparkinfer.kernels import dependent_launch as dl


@triton.jit
def _add_one_kernel(p_x, N, BLOCK: tl.constexpr, USE_PDL: tl.constexpr):
    dl.wait_for_prior_kernels(USE_PDL)
    o = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    tl.store(p_x + o, tl.load(p_x + o, mask=o < N) + 1, mask=o < N)


@pytest.fixture(autouse=True)
def _restore_default():
    yield
    dl.set_dependent_launch(True)


def test_off_for_cpu_tensors_whatever_the_switch():
    dl.set_dependent_launch(True)
    assert not dl.dependent_launch(torch.zeros(1))


@pytest.mark.any_device
def test_kernel_that_waits_first_runs_without_dependent_launch():
    device = "cuda" if torch.cuda.is_available() else "cpu"
    x = torch.arange(37, dtype=torch.float32, device=device)
    pdl = dl.dependent_launch(x)
    _add_one_kernel[(3,)](x, 37, BLOCK=16, USE_PDL=pdl, launch_pdl=pdl)
    assert torch.equal(x.cpu(), torch.arange(37, dtype=torch.float32) + 1)


@pytest.mark.gpu
def test_switch_turns_it_off_on_gpu():
    x = torch.zeros(1, device="cuda")
    dl.set_dependent_launch(False)
    assert not dl.dependent_launch(x)
    dl.set_dependent_launch(True)
    hopper = torch.cuda.get_device_capability()[0] >= 9
    assert dl.dependent_launch(x) == hopper
