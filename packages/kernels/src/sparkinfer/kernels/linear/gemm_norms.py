"""The norms the skinny GEMM can apply to x on the way in, and their checked launch operands."""

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
    """Norm x first, per head of BK channels: y = x' @ weight.T for x' = `gated_rms_norm`(x, z, w).

    weight: [BK] plain norm weight shared by the heads. z: [M, K] gate, unit stride along K.
    """

    weight: torch.Tensor
    eps: float
    z: torch.Tensor


NormOperands = tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, float, int, bool]


def norm_operands(
    x: torch.Tensor, norm: RowNorm | HeadGatedNorm | None, bk: int, split_k: int
) -> NormOperands:
    """(residual, residual_out, norm weight, z, eps, NORM, ROUND_PRODUCT) for a launch with K
    tiles of `bk` in `split_k` slices; x stands in for operands the kernel does not read."""
    k = x.shape[1]
    if norm is None:
        return x, x, x, x, 0.0, NO_NORM_ID, False
    _check_norm_weight(x, norm.weight, bk if isinstance(norm, HeadGatedNorm) else k)
    if isinstance(norm, HeadGatedNorm):
        if k % bk:
            raise ValueError(
                f"skinny_gemm: a head-gated norm needs K a multiple of BK={bk}, got K={k}"
            )
        _check_like_x(x, norm.z, "z")
        round_product = torch.promote_types(norm.weight.dtype, x.dtype) != torch.float32
        return x, x, norm.weight, norm.z, norm.eps, HEAD_GATED_NORM_ID, round_product
    if split_k > 1:
        raise ValueError(
            f"skinny_gemm: a row norm needs one K slice, got {split_k}: use SPLIT_K=1, or "
            "rms_norm then linear"
        )
    if (norm.residual is None) != (norm.residual_out is None):
        raise ValueError("skinny_gemm: RowNorm needs residual and residual_out together")
    if norm.residual is None or norm.residual_out is None:
        return x, x, norm.weight, x, norm.eps, ROW_NORM_ID, False
    _check_like_x(x, norm.residual, "residual")
    _check_like_x(x, norm.residual_out, "residual_out")
    return norm.residual, norm.residual_out, norm.weight, x, norm.eps, ROW_NORM_ID, False


def _check_norm_weight(x: torch.Tensor, weight: torch.Tensor, size: int) -> None:
    if weight.shape != (size,) or weight.stride(0) != 1:
        raise ValueError(
            f"skinny_gemm: the norm weight must be contiguous [{size}], got {tuple(weight.shape)}"
        )
    if weight.dtype not in (x.dtype, torch.float32) or weight.device != x.device:
        raise TypeError(
            f"skinny_gemm: the norm weight must be {x.dtype} or float32 on {x.device}, got "
            f"{weight.dtype} on {weight.device}"
        )


def _check_like_x(x: torch.Tensor, t: torch.Tensor, name: str) -> None:
    if t.shape != x.shape or t.dtype != x.dtype or t.device != x.device or t.stride(1) != 1:
        raise ValueError(
            f"skinny_gemm: {name} must be {tuple(x.shape)} {x.dtype} on {x.device} with unit "
            f"stride along K, got {tuple(t.shape)} {t.dtype} on {t.device}, strides {t.stride()}"
        )
