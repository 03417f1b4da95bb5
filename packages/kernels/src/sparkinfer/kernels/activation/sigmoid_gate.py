"""Output gate of gated attention: x * sigmoid(gate) over [T, H, D], one read of each, one write.

For attention computed outside the fused paged kernels (`paged_attention.dense_prefill`), whose
output and gate are strided views; the result is contiguous [T, H, D].
"""

# Triton's annotations misread valid kernel code: num_warps launch arguments.
# pyright: reportCallIssue=false

from __future__ import annotations

import torch
import triton
import triton.language as tl
from sparkinfer.kernels._triton import check_device, check_dtype, check_last_dim_contiguous

_DTYPES = (torch.bfloat16, torch.float16, torch.float32)
BT = 16


@triton.jit
def _sigmoid_gate_kernel(
    p_x, p_gate, p_y, T, stride_xt, stride_xh, stride_gt, stride_gh, H: tl.constexpr,
    D: tl.constexpr, BD: tl.constexpr, BT: tl.constexpr,
):  # fmt: skip
    i_t, i_h = tl.program_id(0), tl.program_id(1)
    o_t = (i_t * BT + tl.arange(0, BT)).to(tl.int64)
    o_d = tl.arange(0, BD)
    m = (o_t[:, None] < T) & (o_d[None, :] < D)
    b_x = tl.load(p_x + o_t[:, None] * stride_xt + i_h * stride_xh + o_d[None, :], mask=m)
    b_g = tl.load(p_gate + o_t[:, None] * stride_gt + i_h * stride_gh + o_d[None, :], mask=m)
    b_y = b_x.to(tl.float32) * tl.sigmoid(b_g.to(tl.float32))
    p_out = p_y + (o_t[:, None] * H + i_h) * D + o_d[None, :]
    tl.store(p_out, b_y.to(p_y.dtype.element_ty), mask=m)


def sigmoid_gate(x: torch.Tensor, gate: torch.Tensor) -> torch.Tensor:
    """x * sigmoid(gate), computed in fp32.

    Args:
        x: [T, H, D] (bf16, fp16 or fp32), any token/head strides, unit last stride.
        gate: [T, H, D] like x.

    Returns:
        y: [T, H, D] contiguous in x.dtype.
    """
    op = "sigmoid_gate"
    for name, t in (("x", x), ("gate", gate)):
        if t.dim() != 3:
            raise ValueError(f"{op}: {name} has shape {tuple(t.shape)}; expected [T, H, D]")
        check_dtype(op, name, t, _DTYPES)
        check_last_dim_contiguous(op, name, t)
    if gate.shape != x.shape:
        raise ValueError(f"{op}: gate has shape {tuple(gate.shape)}; expected x's {tuple(x.shape)}")
    check_device(op, {"x": x, "gate": gate})
    num_tokens, num_heads, head_dim = x.shape
    y = torch.empty(x.shape, dtype=x.dtype, device=x.device)
    if y.numel() == 0:
        return y
    grid = (triton.cdiv(num_tokens, BT), num_heads)
    _sigmoid_gate_kernel[grid](
        x, gate, y, num_tokens, x.stride(0), x.stride(1), gate.stride(0), gate.stride(1),
        H=num_heads, D=head_dim, BD=triton.next_power_of_2(head_dim), BT=BT, num_warps=4,
    )  # fmt: skip
    return y
