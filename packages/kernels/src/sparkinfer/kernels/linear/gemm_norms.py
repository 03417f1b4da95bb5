"""The norms the one-row GEMV can apply to x on the way in, and their checked launch operands."""

from __future__ import annotations

from dataclasses import dataclass

import torch

NO_NORM_ID, ROW_NORM_ID, HEAD_GATED_NORM_ID = 0, 1, 2  # the kernel's NORM


@dataclass(frozen=True)
class RowNorm:
    """Norm x first: y = x' @ weight.T for x' = rms_norm(x + residual) * (1 + w) (`rms_norm`).

    weight: [K] stored norm weight w. residual: optional [M, K] like x, added first; x + residual
    is then stored to residual_out ([M, K], unit stride along K), the new residual stream.
    """

    weight: torch.Tensor
    eps: float
    residual: torch.Tensor | None = None
    residual_out: torch.Tensor | None = None


@dataclass(frozen=True)
class HeadGatedNorm:
    """Norm x first, per head: y = x' @ weight.T for x' = `gated_rms_norm`(x, z, w) over heads of
    D channels, D = w's length (a power of two dividing the GEMV's BK and K).

    weight: [D] plain norm weight shared by the heads. z: [1, K] gate, unit stride along K.
    """

    weight: torch.Tensor
    eps: float
    z: torch.Tensor


# (residual, residual_out, norm weight, z, eps, NORM, ROUND_PRODUCT, HEAD_DIM)
NormOperands = tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, float, int, bool, int]


def norm_operands(x: torch.Tensor, norm: RowNorm | HeadGatedNorm | None, bk: int) -> NormOperands:
    """The launch operands of `norm` for a GEMV over K tiles of `bk`; x stands in for operands
    the kernel does not read."""
    k = x.shape[1]
    if norm is None:
        return x, x, x, x, 0.0, NO_NORM_ID, False, 1
    if isinstance(norm, HeadGatedNorm):
        d = norm.weight.shape[0] if norm.weight.dim() == 1 else 0
        _check_norm_weight(x, norm.weight, d)
        if d == 0 or d & (d - 1) or bk % d or k % d:
            raise ValueError(
                f"gemv: a head-gated norm needs heads of D channels, D a power of two dividing "
                f"BK={bk} and K={k}; got D={d}: use gated_rms_norm then linear"
            )
        _check_like_x(x, norm.z, "z")
        round_product = torch.promote_types(norm.weight.dtype, x.dtype) != torch.float32
        return x, x, norm.weight, norm.z, norm.eps, HEAD_GATED_NORM_ID, round_product, d
    _check_norm_weight(x, norm.weight, k)
    if (norm.residual is None) != (norm.residual_out is None):
        raise ValueError("gemv: RowNorm needs residual and residual_out together")
    if norm.residual is None or norm.residual_out is None:
        return x, x, norm.weight, x, norm.eps, ROW_NORM_ID, False, 1
    _check_like_x(x, norm.residual, "residual")
    _check_like_x(x, norm.residual_out, "residual_out")
    return norm.residual, norm.residual_out, norm.weight, x, norm.eps, ROW_NORM_ID, False, 1


def _check_norm_weight(x: torch.Tensor, weight: torch.Tensor, size: int) -> None:
    if weight.shape != (size,) or weight.stride(0) != 1:
        raise ValueError(
            f"gemv: the norm weight must be contiguous [{size}], got {tuple(weight.shape)}"
        )
    if weight.dtype not in (x.dtype, torch.float32) or weight.device != x.device:
        raise TypeError(
            f"gemv: the norm weight must be {x.dtype} or float32 on {x.device}, got "
            f"{weight.dtype} on {weight.device}"
        )


def _check_like_x(x: torch.Tensor, t: torch.Tensor, name: str) -> None:
    if t.shape != x.shape or t.dtype != x.dtype or t.device != x.device or t.stride(-1) != 1:
        raise ValueError(
            f"gemv: {name} must be {tuple(x.shape)} {x.dtype} on {x.device} with unit "
            f"stride along K, got {tuple(t.shape)} {t.dtype} on {t.device}, strides {t.stride()}"
        )
