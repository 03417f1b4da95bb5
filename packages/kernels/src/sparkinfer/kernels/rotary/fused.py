"""Partial rotary embedding applied in place to q and k in one launch (rotate_half style).

One program rotates BT tokens: all H query heads and all HKV key heads, first R dims only.
"""

# Triton's annotations misread valid kernel code: num_warps/num_stages.
# pyright: reportCallIssue=false

from __future__ import annotations

import torch
import triton
import triton.language as tl
from sparkinfer.kernels._triton import check_device

_FLOAT_DTYPES = (torch.float32, torch.float16, torch.bfloat16)


@triton.jit
def _rotate_heads(p_x, p_cos1, p_cos2, p_sin1, p_sin2, o_t, m_t, num_heads, stride_t, stride_h,
                  HALF: tl.constexpr, BH: tl.constexpr, BHALF: tl.constexpr):  # fmt: skip
    """Rotate heads [BT, BH, HALF] of one tensor in place; cos/sin halves are [BT, 1, HALF] fp32."""
    o_h = tl.arange(0, BH).to(tl.int64)
    o_d = tl.arange(0, BHALF)
    o_x = o_t[:, None, None] * stride_t + o_h[None, :, None] * stride_h + o_d[None, None, :]
    m = m_t[:, None, None] & (o_h < num_heads)[None, :, None] & (o_d < HALF)[None, None, :]
    b_x1 = tl.load(p_x + o_x, mask=m, other=0.0).to(tl.float32)
    b_x2 = tl.load(p_x + o_x + HALF, mask=m, other=0.0).to(tl.float32)
    # out = x * cos + rotate_half(x) * sin, with rotate_half(x) = cat(-x2, x1).
    b_y1 = b_x1 * p_cos1 - b_x2 * p_sin1
    b_y2 = b_x2 * p_cos2 + b_x1 * p_sin2
    tl.store(p_x + o_x, b_y1.to(p_x.dtype.element_ty), mask=m)
    tl.store(p_x + o_x + HALF, b_y2.to(p_x.dtype.element_ty), mask=m)


@triton.jit
def _apply_rotary_kernel(
    p_q, p_k, p_cos, p_sin,
    T, H, HKV,
    stride_qt, stride_qh, stride_kt, stride_kh, stride_ct, stride_st,
    HALF: tl.constexpr, BT: tl.constexpr, BHQ: tl.constexpr, BHK: tl.constexpr,
    BHALF: tl.constexpr,
):  # fmt: skip
    i_t = tl.program_id(0)
    o_t = i_t.to(tl.int64) * BT + tl.arange(0, BT).to(tl.int64)
    m_t = o_t < T
    o_d = tl.arange(0, BHALF)
    m_cs = m_t[:, None] & (o_d < HALF)[None, :]
    o_c = o_t[:, None] * stride_ct + o_d[None, :]
    o_s = o_t[:, None] * stride_st + o_d[None, :]
    b_cos1 = tl.load(p_cos + o_c, mask=m_cs, other=0.0)[:, None, :]
    b_cos2 = tl.load(p_cos + o_c + HALF, mask=m_cs, other=0.0)[:, None, :]
    b_sin1 = tl.load(p_sin + o_s, mask=m_cs, other=0.0)[:, None, :]
    b_sin2 = tl.load(p_sin + o_s + HALF, mask=m_cs, other=0.0)[:, None, :]
    _rotate_heads(p_q, b_cos1, b_cos2, b_sin1, b_sin2, o_t, m_t, H, stride_qt, stride_qh,
                  HALF, BHQ, BHALF)  # fmt: skip
    _rotate_heads(p_k, b_cos1, b_cos2, b_sin1, b_sin2, o_t, m_t, HKV, stride_kt, stride_kh,
                  HALF, BHK, BHALF)  # fmt: skip


def _check(q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> None:
    if q.dim() != 3 or k.dim() != 3:
        raise ValueError(
            f"apply_rotary: q and k must be [T, H, D], got {tuple(q.shape)} and {tuple(k.shape)}"
        )
    if q.dtype not in _FLOAT_DTYPES or k.dtype != q.dtype:
        raise TypeError(
            f"apply_rotary: q and k must share a float dtype, got {q.dtype} and {k.dtype}"
        )
    if cos.dtype != torch.float32 or sin.dtype != torch.float32:
        raise TypeError(
            f"apply_rotary: cos and sin must be float32, got {cos.dtype} and {sin.dtype}"
        )
    t, d = q.shape[0], q.shape[2]
    if k.shape[0] != t or k.shape[2] != d:
        raise ValueError(f"apply_rotary: k must be [{t}, HKV, {d}] like q, got {tuple(k.shape)}")
    r = cos.shape[-1] if cos.dim() == 2 else -1
    if cos.shape != (t, r) or sin.shape != (t, r) or r % 2 or r > d or r <= 0:
        raise ValueError(
            f"apply_rotary: cos and sin must be [T={t}, R] with R even and <= D={d}, "
            f"got {tuple(cos.shape)} and {tuple(sin.shape)}"
        )
    check_device("apply_rotary", {"q": q, "k": k, "cos": cos, "sin": sin})
    for name, x in (("q", q), ("k", k), ("cos", cos), ("sin", sin)):
        if x.stride(-1) != 1:
            raise ValueError(
                f"apply_rotary: {name} must have unit stride in its last dim, got {x.stride()}"
            )


def apply_rotary(
    q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Rotate the first R = cos.shape[-1] dims of every q and k head in place, NeoX style.

    Args:
        q: [T, H, D] queries (any token/head strides, unit last stride), modified in place.
        k: [T, HKV, D] keys, same dtype, modified in place.
        cos, sin: [T, R] fp32 laid out as cat(freqs, freqs), R even and <= D.

    Returns:
        (q, k): the same tensors, rotated.
    """
    _check(q, k, cos, sin)
    t, h, hkv = q.shape[0], q.shape[1], k.shape[1]
    if t == 0:
        return q, k
    half = cos.shape[-1] // 2
    bt = 4
    _apply_rotary_kernel[(triton.cdiv(t, bt),)](
        q, k, cos, sin,
        t, h, hkv,
        q.stride(0), q.stride(1), k.stride(0), k.stride(1), cos.stride(0), sin.stride(0),
        HALF=half, BT=bt, BHQ=triton.next_power_of_2(h), BHK=triton.next_power_of_2(hkv),
        BHALF=triton.next_power_of_2(half), num_warps=4,
    )  # fmt: skip
    return q, k
