"""Block-scaled FP8 (e4m3) weights in plain torch: the quantizers the loader uses and the
specification of every FP8 GEMM (dequantize, then an fp32 matmul).

Format (Qwen's and DeepSeek's fine-grained FP8, `weight_block_size: [128, 128]`): a weight
[N, K] is stored as float8_e4m3fn beside `weight_scale_inv` [ceil(N / 128), ceil(K / 128)] fp32,
and W[n, k] = weight[n, k] * weight_scale_inv[n // 128, k // 128]. Edge blocks are partial.
A scale of one value per weight row ([N, ceil(K / 128)]) is also accepted: the loader uses it
for a fused parameter whose parts start at rows that are not multiples of 128.
Activations of the prompt path are quantized per token and per 128-column group the same way.
"""

from __future__ import annotations

from typing import NamedTuple

import torch

FP8_DTYPE = torch.float8_e4m3fn
FP8_MAX = 448.0  # the largest finite e4m3 value
BLOCK = 128  # rows and columns of a weight's scale block; columns of an activation group
# Rows of x quantized for cuBLAS's block-scaled GEMM are padded to a multiple of this (zero rows):
# on an H200 it takes 4, 8, 12, 16 and 24 rows and refuses 1, 2, 3, 5, 17 and 33
# (`sparkinfer.lab.kernels.fp8_linear`'s probe row); the Triton GEMMs read the first M rows.
CUBLAS_ROW_MULTIPLE = 4
_MIN_AMAX = 1e-12  # an all-zero block gets a tiny scale instead of a division by zero


class Fp8Activation(NamedTuple):
    """Activations [M, K] quantized per token and 128-column group, as `quantize_activation_fp8`
    returns them: q [P, K] float8_e4m3fn (P >= M, rows past M zero) and scale [P, ceil(K/128)]
    fp32 with strides (1, P)."""

    q: torch.Tensor
    scale: torch.Tensor


def scale_rows(weight: torch.Tensor, weight_scale_inv: torch.Tensor) -> int:
    """Weight rows per row of `weight_scale_inv`: 128 (block scales) or 1 (per-row scales).

    Raises ValueError when the scale's shape fits neither layout.
    """
    n, k = weight.shape
    num_k_blocks = -(-k // BLOCK)
    if weight_scale_inv.dim() == 2 and weight_scale_inv.shape[1] == num_k_blocks:
        if weight_scale_inv.shape[0] == -(-n // BLOCK):
            return BLOCK
        if weight_scale_inv.shape[0] == n:
            return 1
    raise ValueError(
        f"weight_scale_inv has shape {list(weight_scale_inv.shape)}; a weight of shape {[n, k]} "
        f"needs [{-(-n // BLOCK)}, {num_k_blocks}] (128x128 blocks) or [{n}, {num_k_blocks}]"
    )


def expand_scales(weight: torch.Tensor, weight_scale_inv: torch.Tensor) -> torch.Tensor:
    """The scale of every weight element: [N, K] fp32."""
    n, k = weight.shape
    rows = scale_rows(weight, weight_scale_inv)
    s = weight_scale_inv.float().repeat_interleave(rows, dim=0)[:n]
    return s.repeat_interleave(BLOCK, dim=1)[:, :k]


def dequantize_weight_fp8(
    weight: torch.Tensor, weight_scale_inv: torch.Tensor, dtype: torch.dtype = torch.float32
) -> torch.Tensor:
    """weight [N, K] e4m3 and its scales -> the weight it encodes, [N, K] in `dtype`."""
    return (weight.float() * expand_scales(weight, weight_scale_inv)).to(dtype)


def quantize_weight_fp8(weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """A weight [N, K] -> (e4m3 [N, K], weight_scale_inv [ceil(N/128), ceil(K/128)] fp32).

    Each 128x128 block (partial at the edges) gets scale = amax / 448, so its largest element
    maps to the largest e4m3 value; elements are divided by the scale and rounded to nearest.
    """
    n, k = weight.shape
    nb, kb = -(-n // BLOCK), -(-k // BLOCK)
    padded = torch.zeros(nb * BLOCK, kb * BLOCK, dtype=torch.float32, device=weight.device)
    padded[:n, :k] = weight.float()
    blocks = padded.view(nb, BLOCK, kb, BLOCK)
    amax = blocks.abs().amax(dim=(1, 3)).clamp(min=_MIN_AMAX)  # [nb, kb]
    scale = amax / FP8_MAX
    q = (blocks / scale[:, None, :, None]).clamp(-FP8_MAX, FP8_MAX).to(FP8_DTYPE)
    return q.view(nb * BLOCK, kb * BLOCK)[:n, :k].contiguous(), scale


def quantize_activation_fp8_ref(
    x: torch.Tensor, row_multiple: int = 1
) -> tuple[torch.Tensor, torch.Tensor]:
    """Activations [M, K] -> (e4m3 [P, K], scales [P, ceil(K/128)] fp32), per token and group.

    Each row's 128-column group gets scale = amax / 448 (the prompt path's dynamic scheme). P is
    M rounded up to a multiple of `row_multiple`; the rows past M are zero (with the scale of an
    all-zero group). The scales are stored outer-dim major (strides (1, P)): each group's column
    of scales is contiguous, the layout cuBLAS's 1x128 block scaling reads.
    """
    m, k = x.shape
    p, kb = -(-m // row_multiple) * row_multiple, -(-k // BLOCK)
    padded = torch.zeros(p, kb * BLOCK, dtype=torch.float32, device=x.device)
    padded[:m, :k] = x.float()
    groups = padded.view(p, kb, BLOCK)
    scale = groups.abs().amax(dim=2).clamp(min=_MIN_AMAX) / FP8_MAX  # [P, kb]
    q = (groups / scale[:, :, None]).clamp(-FP8_MAX, FP8_MAX).to(FP8_DTYPE)
    return q.view(p, kb * BLOCK)[:, :k].contiguous(), scale.t().contiguous().t()


def fp8_linear_ref(
    x: torch.Tensor,
    weight: torch.Tensor,
    weight_scale_inv: torch.Tensor,
    *,
    x_fp8: Fp8Activation | None = None,
) -> torch.Tensor:
    """y = x @ W.T for the block-scaled FP8 weight W, accumulated in fp32.

    Args:
        x: [M, K] activations (bf16, fp16 or fp32).
        weight: [N, K] float8_e4m3fn.
        weight_scale_inv: [ceil(N/128), ceil(K/128)] (or [N, ceil(K/128)]) fp32 scales.
        x_fp8: x already quantized per token and group (`quantize_activation_fp8(x)`'s bits),
            for the kernels that take e4m3 activations; the reference reads x alone.

    Returns:
        y: [M, N] in x.dtype.
    """
    return (x.float() @ dequantize_weight_fp8(weight, weight_scale_inv).T).to(x.dtype)


def fp8_linear_prompt_ref(
    x: torch.Tensor,
    weight: torch.Tensor,
    weight_scale_inv: torch.Tensor,
    *,
    x_fp8: Fp8Activation | None = None,
) -> torch.Tensor:
    """What the prompt path computes: x quantized per token and 128-column group first.

    Args and returns as `fp8_linear_ref` (x_fp8, the same quantization of x, is not read).
    """
    x_q, x_scale = quantize_activation_fp8_ref(x)
    x_deq = x_q.float() * x_scale.repeat_interleave(BLOCK, dim=1)[:, : x.shape[1]]
    return (x_deq @ dequantize_weight_fp8(weight, weight_scale_inv).T).to(x.dtype)
