"""Plain-torch q/k norm, partial rotary and KV-cache write: the specification for the fused kernel.

Step by step it is `rms_norm_ref` on q and k, `apply_rotary_ref`, then `write_kv_cache_ref`, with
their rounding points (a test checks it against those three run one after the other).
"""

from __future__ import annotations

import torch


def _norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """(1+w) RMSNorm over the last dim in fp32, rounded to x.dtype."""
    xf = x.float()
    y = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps) * (1.0 + weight.float())
    return y.to(x.dtype)


def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """The first R = cos.shape[-1] dims of every head of x [T, H, D] rotated NeoX style in fp32,
    rounded to x.dtype; the other dims as they are."""
    r, half = cos.shape[-1], cos.shape[-1] // 2
    xf = x[..., :r].float()
    rotated = torch.cat((-xf[..., half:], xf[..., :half]), dim=-1)
    out = x.clone()
    out[..., :r] = (xf * cos[:, None, :] + rotated * sin[:, None, :]).to(x.dtype)
    return out


def qk_norm_rotary_ref(
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

    Per head: y = (x_f32 * rsqrt(mean(x^2) + eps) * (1 + w)) rounded to x.dtype (rms_norm_ref),
    then the first R dims rotate NeoX style in fp32 and round again (apply_rotary_ref). The normed
    and rotated k and the raw v go to cache row slot_mapping[t] (write_kv_cache_ref); q is
    returned. Inputs are not modified.

    Args:
        q: [T, H, D] queries (bf16, fp16 or fp32).
        k: [T, HKV, D] keys, same dtype.
        v: [T, HKV, D] values, same dtype.
        q_weight, k_weight: [D] stored norm weights w (the effective scale is 1 + w).
        eps: variance epsilon of both norms.
        cos, sin: [T, R] fp32, R even and <= D, laid out as cat(freqs, freqs).
        k_cache, v_cache: [num_blocks, block_size, HKV, D] in q's dtype, written in place.
        slot_mapping: [T] int64 flat row block * block_size + offset; -1 skips the token's K and V
            (its q is still produced).

    Returns:
        q_out: [T, H, D] contiguous in q.dtype, normed and rotated.
    """
    q_out = _rotate(_norm(q, q_weight, eps), cos, sin)
    k_out = _rotate(_norm(k, k_weight, eps), cos, sin)
    block_size = k_cache.shape[1]
    for t in range(k.shape[0]):
        slot = int(slot_mapping[t])
        if slot < 0:  # the token writes no cache row
            continue
        block, offset = divmod(slot, block_size)
        k_cache[block, offset] = k_out[t]
        v_cache[block, offset] = v[t]
    return q_out.contiguous()
