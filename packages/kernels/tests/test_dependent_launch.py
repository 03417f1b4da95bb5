"""Programmatic dependent launch: off on the CPU and under the interpreter, switched by the
current `KernelTuning`, and a kernel that waits first still computes the same result when launched
without it."""

import pytest
import torch
import triton
import triton.language as tl
from sparkinfer.kernels import dependent_launch as dl
from sparkinfer.kernels.tuning import KernelTuning, kernel_tuning

OFF = KernelTuning(use_dependent_launch=False)


@triton.jit
def _add_one_kernel(p_x, N, BLOCK: tl.constexpr, USE_PDL: tl.constexpr):
    dl.wait_for_prior_kernels(USE_PDL)
    o = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    tl.store(p_x + o, tl.load(p_x + o, mask=o < N) + 1, mask=o < N)


def test_off_for_cpu_tensors_whatever_the_tuning():
    with kernel_tuning(KernelTuning(use_dependent_launch=True)):
        assert not dl.dependent_launch(torch.zeros(1))


@pytest.mark.any_device
def test_kernel_that_waits_first_runs_without_dependent_launch(assert_same_bits):
    device = "cuda" if torch.cuda.is_available() else "cpu"
    x = torch.arange(37, dtype=torch.float32, device=device)
    pdl = dl.dependent_launch(x)
    _add_one_kernel[(3,)](x, 37, BLOCK=16, USE_PDL=pdl, launch_pdl=pdl)
    assert_same_bits(x.cpu(), torch.arange(37, dtype=torch.float32) + 1)


@pytest.mark.gpu
def test_tuning_turns_it_off_on_gpu():
    x = torch.zeros(1, device="cuda")
    with kernel_tuning(OFF):
        assert not dl.dependent_launch(x)
    hopper = torch.cuda.get_device_capability()[0] >= 9
    assert dl.dependent_launch(x) == hopper  # the default, outside any kernel_tuning


@pytest.mark.gpu
def test_early_state_reads_give_the_waiting_bits_in_a_decode_graph():
    """in_proj (a dependent GEMV), conv update, recurrent GDN decode, replayed as one CUDA graph for
    several steps at 27B shapes: the state reads before the wait (`early_state`) give the bits of
    reads after it, outputs and state pools alike."""
    from sparkinfer.kernels.causal_conv1d import causal_conv1d_update
    from sparkinfer.kernels.gated_delta_rule import fused_recurrent_gated_delta_rule
    from sparkinfer.kernels.linear import linear

    gen = torch.Generator(device="cuda").manual_seed(3)
    nh, nhv, dk, hidden, batch = 16, 48, 128, 5120, 4
    conv_dim = 2 * nh * dk + nhv * dk

    def randn(*shape, dtype=torch.bfloat16, scale=1.0):
        return torch.randn(*shape, device="cuda", generator=gen, dtype=dtype) * scale

    w_in = randn(conv_dim + 2 * nhv, hidden, scale=0.02)
    conv_w, a_log = randn(conv_dim, 4), randn(nhv, dtype=torch.float32)
    dt_bias = randn(nhv, dtype=torch.float32)
    x = randn(batch, hidden)
    slots = torch.tensor([2, -1, 0, 5], device="cuda")
    conv0, rec0 = randn(6, 3, conv_dim), randn(6, nhv, dk, dk, dtype=torch.float32, scale=0.1)

    def run(early: bool) -> tuple[torch.Tensor, ...]:
        conv_state, rec_state = conv0.clone(), rec0.clone()

        def step() -> torch.Tensor:
            qkv, b, a = linear(x, w_in).split((conv_dim, nhv, nhv), dim=-1)
            qkv = causal_conv1d_update(qkv, conv_w, conv_state, state_slots=slots,
                                       early_state=early)  # fmt: skip
            q, k, v = qkv.split((nh * dk, nh * dk, nhv * dk), dim=-1)
            return fused_recurrent_gated_delta_rule(
                q.view(batch, nh, dk), k.view(batch, nh, dk), v.view(batch, nhv, dk), a, b,
                a_log, dt_bias, rec_state, state_slots=slots, early_state=early,
            )  # fmt: skip

        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            step()  # compiles; its state update is part of the compared history
        torch.cuda.current_stream().wait_stream(stream)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            out = step()
        outs = []
        for _ in range(4):
            graph.replay()
            outs.append(out.clone())
        torch.cuda.synchronize()
        return (*outs, conv_state, rec_state)

    for got, expected in zip(run(True), run(False), strict=True):
        assert torch.equal(got, expected)
