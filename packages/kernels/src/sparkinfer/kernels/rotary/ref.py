"""Plain-torch partial rotary embedding (rotate_half style): the specification for the kernel."""

from __future__ import annotations

import torch


def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x [T, H, R] rotated by cos/sin [T, R] in fp32, returned in x.dtype."""
    half = x.shape[-1] // 2
    xf = x.float()
    rotated = torch.cat((-xf[..., half:], xf[..., :half]), dim=-1)
    return (xf * cos[:, None, :] + rotated * sin[:, None, :]).to(x.dtype)


def apply_rotary_ref(
    q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Rotate the first R = cos.shape[-1] dims of every q and k head in place, NeoX style.

    Dim d < R/2 pairs with d + R/2: out = x * cos + rotate_half(x) * sin with
    rotate_half(x) = cat(-x[R/2:R], x[:R/2]). Dims R..D are left untouched. The maths runs in fp32
    and is cast back to the input dtype (transformers' apply_rotary_pos_emb up to that rounding).

    Args:
        q: [T, H, D] queries, modified in place.
        k: [T, HKV, D] keys, modified in place.
        cos, sin: [T, R] fp32, R even and <= D, laid out as cat(freqs, freqs).

    Returns:
        (q, k): the same tensors, rotated.
    """
    r = cos.shape[-1]
    q[..., :r] = _rotate(q[..., :r], cos, sin)
    k[..., :r] = _rotate(k[..., :r], cos, sin)
    return q, k
