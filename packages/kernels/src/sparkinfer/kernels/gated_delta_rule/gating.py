"""Gated-DeltaNet gates: g = -exp(A_log) * softplus(a + dt_bias) and beta = sigmoid(b), in fp32."""

# Triton's annotations misread valid kernel code: constexpr arguments.
# pyright: reportArgumentType=false

import torch
import triton
import triton.language as tl
from sparkinfer.kernels._triton import (
    check_device,
    check_dtype,
    check_last_dim_contiguous,
    check_ndim,
    check_shape,
)

GATE_DTYPES = (torch.bfloat16, torch.float16, torch.float32)
BT = 32


@triton.jit
def _gates(b_a, b_b, b_a_log, b_dt_bias):
    """(g, beta) in fp32 from fp32 tiles; softplus switches to identity above 20, as torch does."""
    b_x = b_a + b_dt_bias
    b_softplus = tl.where(b_x > 20.0, b_x, tl.log(1.0 + tl.exp(tl.minimum(b_x, 20.0))))
    b_g = -tl.exp(b_a_log) * b_softplus
    b_beta = 1.0 / (1.0 + tl.exp(-b_b))
    return b_g, b_beta


@triton.jit(do_not_specialize=["num_tokens"])  # sizes of the step: one build for all
def _gdn_gating_kernel(
    a, b, A_log, dt_bias, g, beta, num_tokens, stride_at, stride_bt,
    HV: tl.constexpr, BT: tl.constexpr, BHV: tl.constexpr,
):  # fmt: skip
    i_t = tl.program_id(0).to(tl.int64)
    o_t = i_t * BT + tl.arange(0, BT)
    o_h = tl.arange(0, BHV)
    m_h = o_h < HV
    m = (o_t < num_tokens)[:, None] & m_h[None, :]
    b_a = tl.load(a + o_t[:, None] * stride_at + o_h[None, :], mask=m, other=0.0).to(tl.float32)
    b_b = tl.load(b + o_t[:, None] * stride_bt + o_h[None, :], mask=m, other=0.0).to(tl.float32)
    b_a_log = tl.load(A_log + o_h, mask=m_h, other=0.0).to(tl.float32)
    b_dt_bias = tl.load(dt_bias + o_h, mask=m_h, other=0.0).to(tl.float32)
    b_g, b_beta = _gates(b_a, b_b, b_a_log[None, :], b_dt_bias[None, :])
    o_out = o_t[:, None] * HV + o_h[None, :]
    tl.store(g + o_out, b_g, mask=m)
    tl.store(beta + o_out, b_beta, mask=m)


def check_gate_inputs(
    op: str, a: torch.Tensor, b: torch.Tensor, A_log: torch.Tensor, dt_bias: torch.Tensor
) -> None:
    """a, b [N, HV] with unit last stride; A_log, dt_bias [HV]; all float."""
    check_ndim(op, "a", a, 2, "[N, HV]")
    num_v_heads = a.shape[1]
    check_shape(op, "b", b, tuple(a.shape))
    check_shape(op, "A_log", A_log, (num_v_heads,))
    check_shape(op, "dt_bias", dt_bias, (num_v_heads,))
    for name, t in (("a", a), ("b", b), ("A_log", A_log), ("dt_bias", dt_bias)):
        check_dtype(op, name, t, GATE_DTYPES)
        check_last_dim_contiguous(op, name, t)


def gdn_gating(
    a: torch.Tensor, b: torch.Tensor, A_log: torch.Tensor, dt_bias: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Gated-DeltaNet gates from the raw projections.

    Args:
        a: [T, HV] raw decay projection (bf16, fp16 or fp32; rows may be strided).
        b: [T, HV] raw write-strength projection.
        A_log: [HV] log of the decay rate.
        dt_bias: [HV] bias added to ``a`` before the softplus.

    Returns:
        (g, beta): both [T, HV] fp32; g = -exp(A_log) * softplus(a + dt_bias), beta = sigmoid(b).
    """
    op = "gdn_gating"
    check_gate_inputs(op, a, b, A_log, dt_bias)
    check_device(op, {"a": a, "b": b, "A_log": A_log, "dt_bias": dt_bias})
    num_tokens, num_v_heads = a.shape
    g = torch.empty(num_tokens, num_v_heads, dtype=torch.float32, device=a.device)
    beta = torch.empty_like(g)
    if num_tokens > 0:
        _gdn_gating_kernel[(triton.cdiv(num_tokens, BT),)](
            a, b, A_log, dt_bias, g, beta, num_tokens, a.stride(0), b.stride(0),
            HV=num_v_heads, BT=BT, BHV=triton.next_power_of_2(num_v_heads),
        )  # fmt: skip
    return g, beta
