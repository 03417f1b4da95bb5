"""Causal GQA attention of one prompt chunk with no cached prefix, on contiguous-row K and V.

A prompt's first chunk attends only to itself, so it needs no block table: torch's
scaled_dot_product_attention runs it, cuDNN's fused attention first where the build has it (on
an H200 it ran a 4K prompt at 24 query / 4 KV heads, head_dim 256, 1.5x faster than the paged
prefill kernel; docs/benchmarks.md), then flash, memory-efficient and math. The sigmoid output
gate follows in one Triton pass that also lays the output out as [T, H, D].

Its bits differ from the paged kernel's, and later chunks of the same prompt run the paged
kernel, so callers that promise chunk-invariant numerics keep the paged kernel for every chunk.
"""

# Triton's annotations misread valid kernel code: constexpr arguments, num_warps.
# pyright: reportArgumentType=false, reportCallIssue=false

from __future__ import annotations

import torch
import torch.nn.functional as F
import triton
import triton.language as tl
from sparkinfer.kernels._triton import check_device
from sparkinfer.kernels.paged_attention.checks import ATTENTION_DTYPES
from torch.nn.attention import SDPBackend, sdpa_kernel

# Tried in this order; SDPA skips a backend that cannot run the inputs.
_BACKENDS = [
    SDPBackend.CUDNN_ATTENTION,
    SDPBackend.FLASH_ATTENTION,
    SDPBackend.EFFICIENT_ATTENTION,
    SDPBackend.MATH,
]
_GATE_ELEMENTS = 4096  # elements of o per program of the gate pass


@triton.jit
def _sigmoid_gate_kernel(
    p_o, p_g, p_y, num_rows, H, stride_ot, stride_oh, stride_gt, stride_gh,
    D: tl.constexpr, BR: tl.constexpr, BD: tl.constexpr,
):  # fmt: skip
    """y [T * H, D] = o * sigmoid(gate) for BR (token, head) rows of strided [T, H, D] views."""
    o_r = tl.program_id(0).to(tl.int64) * BR + tl.arange(0, BR).to(tl.int64)
    o_d = tl.arange(0, BD)
    m = (o_r < num_rows)[:, None] & (o_d < D)[None, :]
    o_t, o_h = o_r // H, o_r % H
    b_o = tl.load(p_o + (o_t * stride_ot + o_h * stride_oh)[:, None] + o_d[None, :], mask=m)
    b_g = tl.load(p_g + (o_t * stride_gt + o_h * stride_gh)[:, None] + o_d[None, :], mask=m)
    b_y = b_o.to(tl.float32) * tl.sigmoid(b_g.to(tl.float32))
    tl.store(p_y + o_r[:, None] * D + o_d[None, :], b_y.to(p_y.dtype.element_ty), mask=m)


def sigmoid_gate(o: torch.Tensor, gate: torch.Tensor) -> torch.Tensor:
    """o * sigmoid(gate) in fp32, stored contiguous [T, H, D] in o's dtype (views with a unit
    last stride in, any token and head strides)."""
    y = torch.empty(o.shape, dtype=o.dtype, device=o.device)
    num_rows, d = o.shape[0] * o.shape[1], o.shape[2]
    if num_rows == 0:
        return y
    bd = triton.next_power_of_2(d)
    br = max(1, _GATE_ELEMENTS // bd)
    _sigmoid_gate_kernel[(triton.cdiv(num_rows, br),)](
        o, gate, y, num_rows, o.shape[1], o.stride(0), o.stride(1), gate.stride(0),
        gate.stride(1), D=d, BR=br, BD=bd, num_warps=4,
    )  # fmt: skip
    return y


def _check(q, k, v, gate) -> None:
    op = "causal_attention"
    if q.dim() != 3 or k.dim() != 3 or k.shape != v.shape:
        raise ValueError(
            f"{op}: q {list(q.shape)}, k {list(k.shape)}, v {list(v.shape)}; expected q "
            "[T, H, D] and k, v [T, HKV, D]"
        )
    (t, h, d), (tk, hkv, dk) = q.shape, k.shape
    if tk != t or dk != d or hkv == 0 or h % hkv:
        raise ValueError(
            f"{op}: q {list(q.shape)} and k {list(k.shape)}; expected the same T and D, and H "
            "a multiple of HKV"
        )
    if q.dtype not in ATTENTION_DTYPES or k.dtype != q.dtype or v.dtype != q.dtype:
        raise TypeError(f"{op}: q, k, v are {q.dtype}, {k.dtype}, {v.dtype}; expected one of "
                        "bf16, fp16, fp32")  # fmt: skip
    tensors = {"q": q, "k": k, "v": v}
    if gate is not None:
        if gate.shape != q.shape or gate.dtype != q.dtype:
            raise ValueError(
                f"{op}: gate is {gate.dtype} {list(gate.shape)}; expected q's {q.dtype} "
                f"{list(q.shape)}"
            )
        tensors["gate"] = gate
    for name, x in tensors.items():
        if x.stride(-1) != 1:
            raise ValueError(f"{op}: {name} has strides {x.stride()}; expected a unit last stride")
    check_device(op, tensors)


def causal_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    *,
    scale: float,
    gate: torch.Tensor | None = None,
) -> torch.Tensor:
    """Causal attention of one sequence's tokens over themselves (no cached prefix).

    Args:
        q: [T, H, D] queries (bf16, fp16 or fp32), unit last stride.
        k, v: [T, HKV, D] keys and values of the same tokens, same dtype; query head h reads KV
            head h // (H // HKV). Rows may be strided (views of a projection or a cache).
        scale: softmax scale, usually D ** -0.5.
        gate: optional [T, H, D]; the output is multiplied by sigmoid(gate).

    Returns:
        o: [T, H, D] contiguous in q.dtype.
    """
    _check(q, k, v, gate)
    if q.shape[0] == 0:
        return torch.empty(q.shape, dtype=q.dtype, device=q.device)
    with sdpa_kernel(_BACKENDS, set_priority=True):
        o = F.scaled_dot_product_attention(
            q.transpose(0, 1).unsqueeze(0),
            k.transpose(0, 1).unsqueeze(0),
            v.transpose(0, 1).unsqueeze(0),
            is_causal=True,
            scale=scale,
            enable_gqa=True,
        )
    o = o.squeeze(0).transpose(0, 1)  # [T, H, D], laid out as the backend left it
    return sigmoid_gate(o, gate) if gate is not None else o.contiguous()
