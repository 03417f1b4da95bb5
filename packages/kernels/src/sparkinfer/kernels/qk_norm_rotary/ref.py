"""Plain-torch q/k norm, partial rotary and KV-cache write: the specification for the fused kernel.

It composes the references of the three steps it fuses, so it means exactly what running them one
after the other means.
"""

from __future__ import annotations

import torch
from sparkinfer.kernels.paged_attention.ref import write_kv_cache_ref
from sparkinfer.kernels.rms_norm.ref import rms_norm_ref
from sparkinfer.kernels.rotary.ref import apply_rotary_ref


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
    q_out, _ = rms_norm_ref(q, q_weight, eps)
    k_out, _ = rms_norm_ref(k, k_weight, eps)
    apply_rotary_ref(q_out, k_out, cos, sin)
    write_kv_cache_ref(k_out, v, k_cache, v_cache, slot_mapping)
    return q_out.contiguous()
