"""q/k (1+w) RMSNorm, partial rotary and the KV-cache write of one attention layer in one launch.

Grid (T, q head groups + KV head groups); a program takes BH heads of one token, held whole in
registers. A q program norms its heads, rotates the first R dims and writes the new q rows. A KV
program reads the token's slot first: for slot >= 0 it norms and rotates its k heads and stores
them, and copies the raw v heads, straight into the cache row; for slot < 0 it does nothing. The
rounding points are those of the unfused ops: the norm rounds to the input dtype, then the rotary
runs in fp32 and rounds again.
"""

# Triton's annotations misread valid kernel code: num_warps/num_stages.
# pyright: reportCallIssue=false

from __future__ import annotations

import torch
import triton
import triton.language as tl
from sparkinfer.kernels._triton import check_device
from sparkinfer.kernels.dependent_launch import dependent_launch, wait_for_prior_kernels
from sparkinfer.kernels.paged_attention.checks import check_cache

_OP = "qk_norm_rotary"
_MAX_D = 1024
_FLOAT_DTYPES = (torch.float32, torch.float16, torch.bfloat16)


@triton.jit
def _load_normed(p_x, p_w, o_x, o_d, m_h, m_d, b_rstd, OUT_DTYPE: tl.constexpr):
    """x * rstd * (1 + w) at heads o_x and dims o_d, rounded to OUT_DTYPE; [BH, len(o_d)] fp32."""
    b_x = tl.load(p_x + o_x[:, None] + o_d[None, :], mask=m_h[:, None] & m_d[None, :], other=0.0)
    b_w = tl.load(p_w + o_d, mask=m_d, other=0.0).to(tl.float32)
    b_y = b_x.to(tl.float32) * b_rstd[:, None] * (1.0 + b_w[None, :])
    return b_y.to(OUT_DTYPE).to(tl.float32)


@triton.jit
def _norm_rotate_heads(
    p_x, p_w, p_y, p_cos, p_sin,
    o_h, m_h, stride_xh, stride_yh, D, eps,
    HALF: tl.constexpr, BD: tl.constexpr, BHALF: tl.constexpr,
):  # fmt: skip
    """Norm heads o_h of one token row p_x [H, D], rotate dims < 2*HALF, store them at p_y."""
    out_dtype = p_y.dtype.element_ty
    o_x, o_y = o_h * stride_xh, o_h * stride_yh
    o_d = tl.arange(0, BD)
    m = m_h[:, None] & (o_d < D)[None, :]
    b_x = tl.load(p_x + o_x[:, None] + o_d[None, :], mask=m, other=0.0).to(tl.float32)
    b_rstd = 1.0 / tl.sqrt(tl.sum(b_x * b_x, axis=1) / D + eps)  # [BH]
    b_w = tl.load(p_w + o_d, mask=o_d < D, other=0.0).to(tl.float32)
    # Dims 2*HALF..D pass through the rotary: store them normed.
    b_y = b_x * b_rstd[:, None] * (1.0 + b_w[None, :])
    m_tail = m & (o_d >= 2 * HALF)[None, :]
    tl.store(p_y + o_y[:, None] + o_d[None, :], b_y.to(out_dtype), mask=m_tail)
    # Dims d < HALF pair with d + HALF: re-read both halves (cache hits) instead of shuffling.
    o_r = tl.arange(0, BHALF)
    m_r = o_r < HALF
    b_y1 = _load_normed(p_x, p_w, o_x, o_r, m_h, m_r, b_rstd, out_dtype)
    b_y2 = _load_normed(p_x, p_w, o_x, o_r + HALF, m_h, m_r, b_rstd, out_dtype)
    b_cos1 = tl.load(p_cos + o_r, mask=m_r, other=0.0)[None, :]
    b_cos2 = tl.load(p_cos + o_r + HALF, mask=m_r, other=0.0)[None, :]
    b_sin1 = tl.load(p_sin + o_r, mask=m_r, other=0.0)[None, :]
    b_sin2 = tl.load(p_sin + o_r + HALF, mask=m_r, other=0.0)[None, :]
    # out = y * cos + rotate_half(y) * sin, with rotate_half(y) = cat(-y2, y1).
    b_r1 = b_y1 * b_cos1 - b_y2 * b_sin1
    b_r2 = b_y2 * b_cos2 + b_y1 * b_sin2
    m_hr = m_h[:, None] & m_r[None, :]
    tl.store(p_y + o_y[:, None] + o_r[None, :], b_r1.to(out_dtype), mask=m_hr)
    tl.store(p_y + o_y[:, None] + o_r[None, :] + HALF, b_r2.to(out_dtype), mask=m_hr)


@triton.jit
def _qk_norm_rotary_kernel(
    p_q, p_k, p_v, p_wq, p_wk, p_cos, p_sin, p_kc, p_vc, p_slot, p_qo,
    H, HKV, D, eps, num_q_groups,
    stride_qt, stride_qh, stride_kt, stride_kh, stride_vt, stride_vh, stride_ct, stride_st,
    stride_kcb, stride_kcs, stride_kch, stride_vcb, stride_vcs, stride_vch,
    BLOCK_SIZE: tl.constexpr, HALF: tl.constexpr, BH: tl.constexpr, BD: tl.constexpr,
    BHALF: tl.constexpr, USE_PDL: tl.constexpr,
):  # fmt: skip
    wait_for_prior_kernels(USE_PDL)
    i_t, i_g = tl.program_id(0).to(tl.int64), tl.program_id(1)
    p_cos += i_t * stride_ct
    p_sin += i_t * stride_st
    if i_g < num_q_groups:
        o_h = i_g.to(tl.int64) * BH + tl.arange(0, BH).to(tl.int64)
        _norm_rotate_heads(p_q + i_t * stride_qt, p_wq, p_qo + i_t * H * D, p_cos, p_sin,
                           o_h, o_h < H, stride_qh, D, D, eps, HALF, BD, BHALF)  # fmt: skip
    else:
        slot = tl.load(p_slot + i_t)
        if slot >= 0:
            block, offset = slot // BLOCK_SIZE, slot % BLOCK_SIZE
            p_kc += block * stride_kcb + offset * stride_kcs
            p_vc += block * stride_vcb + offset * stride_vcs
            o_h = (i_g - num_q_groups).to(tl.int64) * BH + tl.arange(0, BH).to(tl.int64)
            m_h = o_h < HKV
            _norm_rotate_heads(p_k + i_t * stride_kt, p_wk, p_kc, p_cos, p_sin, o_h, m_h,
                               stride_kh, stride_kch, D, eps, HALF, BD, BHALF)  # fmt: skip
            o_d = tl.arange(0, BD)
            m = m_h[:, None] & (o_d < D)[None, :]
            b_v = tl.load(p_v + i_t * stride_vt + o_h[:, None] * stride_vh + o_d[None, :], mask=m)
            tl.store(p_vc + o_h[:, None] * stride_vch + o_d[None, :], b_v, mask=m)


def _check(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    weights: dict[str, torch.Tensor],
    cos: torch.Tensor,
    sin: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    slot_mapping: torch.Tensor,
) -> None:
    tensors = {"q": q, "k": k, "v": v, **weights, "cos": cos, "sin": sin, "k_cache": k_cache,
               "v_cache": v_cache, "slot_mapping": slot_mapping}  # fmt: skip
    check_device(_OP, tensors)
    check_cache(_OP, k_cache, v_cache)
    if q.dim() != 3:
        raise ValueError(f"{_OP}: q has shape {list(q.shape)}; expected [T, H, D]")
    t, d = q.shape[0], q.shape[2]
    hkv = k_cache.shape[2]
    if k_cache.shape[3] != d:
        raise ValueError(f"{_OP}: the cache's head dim is {k_cache.shape[3]}; q's is {d}")
    if d > _MAX_D:
        raise ValueError(f"{_OP}: head dim {d} exceeds the kernel limit {_MAX_D}")
    for name, x in (("q", q), ("k", k), ("v", v)):
        if x.dtype not in _FLOAT_DTYPES or x.dtype != k_cache.dtype:
            raise TypeError(f"{_OP}: {name} is {x.dtype} but the cache is {k_cache.dtype}")
        if x.stride(-1) != 1:
            raise ValueError(f"{_OP}: {name} has strides {x.stride()}; expected a unit last stride")
    for name, x in (("k", k), ("v", v)):
        if tuple(x.shape) != (t, hkv, d):
            raise ValueError(
                f"{_OP}: {name} has shape {list(x.shape)}; expected [{t}, {hkv}, {d}] "
                "(q's tokens, the cache's heads)"
            )
    for name, w in weights.items():
        if w.dtype not in (q.dtype, torch.float32):
            raise TypeError(f"{_OP}: {name} is {w.dtype}; expected {q.dtype} or float32")
        if tuple(w.shape) != (d,) or w.stride(0) != 1:
            raise ValueError(f"{_OP}: {name} has shape {list(w.shape)}; expected contiguous [{d}]")
    if cos.dtype != torch.float32 or sin.dtype != torch.float32:
        raise TypeError(f"{_OP}: cos and sin are {cos.dtype} and {sin.dtype}; expected float32")
    r = cos.shape[-1] if cos.dim() == 2 else -1
    if cos.shape != (t, r) or sin.shape != (t, r) or r % 2 or not 0 < r <= d:
        raise ValueError(
            f"{_OP}: cos and sin have shapes {list(cos.shape)} and {list(sin.shape)}; "
            f"expected [T={t}, R] with R even and <= D={d}"
        )
    if cos.stride(-1) != 1 or sin.stride(-1) != 1:
        raise ValueError(
            f"{_OP}: cos and sin have strides {cos.stride()} and {sin.stride()}; "
            "expected a unit last stride"
        )
    if slot_mapping.dtype != torch.int64 or tuple(slot_mapping.shape) != (t,):
        raise ValueError(
            f"{_OP}: slot_mapping is {slot_mapping.dtype} {list(slot_mapping.shape)}; "
            f"expected int64 [{t}]"
        )
    if slot_mapping.stride(0) != 1:
        raise ValueError(
            f"{_OP}: slot_mapping has strides {slot_mapping.stride()}; expected a contiguous "
            "tensor: call .contiguous() first"
        )


def qk_norm_rotary(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    *,
    q_weight: torch.Tensor,
    k_weight: torch.Tensor,
    eps: float,
    cos: torch.Tensor,
    sin: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    slot_mapping: torch.Tensor,
) -> torch.Tensor:
    """(1+w) RMSNorm of each q and k head, rotary on the first R dims, then K and V into the cache.

    Equals rms_norm on q and k, apply_rotary, then write_kv_cache, with the same rounding points.

    Args:
        q: [T, H, D] queries (bf16, fp16 or fp32), any token/head strides, unit last stride.
        k: [T, HKV, D] keys, same dtype and stride rules.
        v: [T, HKV, D] values, same dtype and stride rules.
        q_weight, k_weight: [D] contiguous stored norm weights w (q's dtype or fp32); the effective
            scale is 1 + w.
        eps: variance epsilon of both norms.
        cos, sin: [T, R] fp32 (unit last stride), R even and <= D, laid out as cat(freqs, freqs).
        k_cache, v_cache: [num_blocks, block_size, HKV, D] in q's dtype, written in place.
        slot_mapping: [T] int64 contiguous flat row block * block_size + offset; -1 skips the
            token's K and V (its q is still produced).

    Returns:
        q_out: [T, H, D] contiguous in q.dtype, normed and rotated.
    """
    weights = {"q_weight": q_weight, "k_weight": k_weight}
    _check(q, k, v, weights, cos, sin, k_cache, v_cache, slot_mapping)
    t, h, d = q.shape
    hkv = k.shape[1]
    q_out = torch.empty((t, h, d), dtype=q.dtype, device=q.device)
    if t == 0:
        return q_out
    bd = triton.next_power_of_2(d)
    bh = max(1, min(4, 1024 // bd))  # up to 1K elements per program: 4 heads at D=256
    num_q_groups = triton.cdiv(h, bh)
    half = cos.shape[-1] // 2
    pdl = dependent_launch(q)
    _qk_norm_rotary_kernel[(t, num_q_groups + triton.cdiv(hkv, bh))](
        q, k, v, q_weight, k_weight, cos, sin, k_cache, v_cache, slot_mapping, q_out,
        h, hkv, d, eps, num_q_groups,
        q.stride(0), q.stride(1), k.stride(0), k.stride(1), v.stride(0), v.stride(1),
        cos.stride(0), sin.stride(0), *k_cache.stride()[:3], *v_cache.stride()[:3],
        BLOCK_SIZE=k_cache.shape[1], HALF=half, BH=bh, BD=bd,
        BHALF=triton.next_power_of_2(half), USE_PDL=pdl, num_warps=4, launch_pdl=pdl,
    )  # fmt: skip
    return q_out
