"""RMSNorm with residual add whose output is also quantized per token and 128-column group to
e4m3, in one kernel, for an FP8 linear that follows the norm.

Each program first norms its rows exactly as `rms_norm` does (the same `norm_rows` code, tiles and
warps, so y has `rms_norm`'s bits), stores y and the residual sum, then reloads its own y rows
(after a barrier, from L1) as [BR, groups, 128] tiles and quantizes them as
`fp8_linear.quantize_activation_fp8` does: scale = max(amax, 1e-12) / 448, values rounded to
e4m3 on the bits. So the e4m3 rows and scales are what the quantizer gives on y, bit for bit, and
the FP8 GEMMs that would quantize x themselves take them instead (`fp8_linear(x_fp8=...)`),
which saves a launch and a read of x per projection. The specification is
`ref.rms_norm_quantize_fp8_ref`.
"""

# Triton's annotations misread valid kernel code: num_warps.
# pyright: reportCallIssue=false

from __future__ import annotations

import torch
import triton
import triton.language as tl
from sparkinfer.kernels.dependent_launch import dependent_launch, wait_for_prior_kernels
from sparkinfer.kernels.fp8_linear.quantize import round_to_e4m3
from sparkinfer.kernels.fp8_linear.ref import (
    BLOCK,
    CUBLAS_ROW_MULTIPLE,
    FP8_DTYPE,
    FP8_MAX,
    Fp8Activation,
)
from sparkinfer.kernels.rms_norm.fused import (
    as_rows,
    check_norm_operands,
    norm_rows,
    norm_tiles,
    rms_norm_warps,
)


@triton.jit
def _rms_norm_quantize_kernel(
    p_x, p_res, p_w, p_y, p_res_out, p_q, p_s,
    num_rows, P, R2, N, eps,
    stride_x1, stride_x2, stride_r1, stride_r2,
    HAS_RESIDUAL: tl.constexpr, BR: tl.constexpr, BN: tl.constexpr, NG: tl.constexpr,
    GROUP: tl.constexpr, FP8_LIMIT: tl.constexpr, USE_PDL: tl.constexpr,
):  # fmt: skip
    wait_for_prior_kernels(USE_PDL)
    i_r = tl.program_id(0)
    norm_rows(
        p_x, p_res, p_w, p_y, p_res_out, i_r,
        num_rows, R2, N, eps, stride_x1, stride_x2, stride_r1, stride_r2,
        HAS_RESIDUAL, BR, BN,
    )  # fmt: skip
    tl.debug_barrier()  # this program's stores of y precede its loads of y below
    o_r = i_r.to(tl.int64) * BR + tl.arange(0, BR).to(tl.int64)
    o_g = tl.arange(0, NG)
    o_k = (o_g * GROUP)[:, None] + tl.arange(0, GROUP)[None, :]  # [NG, GROUP]
    m_k = o_k < N
    o_rk = o_r[:, None, None] * N + o_k[None, :, :]
    b_y = tl.load(p_y + o_rk, mask=(o_r < num_rows)[:, None, None] & m_k[None, :, :], other=0.0)
    b_y = b_y.to(tl.float32)  # rows num_rows..P-1 are padding: zeros, as the quantizer's
    b_scale = tl.maximum(tl.max(tl.abs(b_y), axis=2), 1e-12) / FP8_LIMIT  # [BR, NG]
    b_q = round_to_e4m3(tl.clamp(b_y / b_scale[:, :, None], -FP8_LIMIT, FP8_LIMIT))
    m_p = o_r < P
    tl.store(p_q + o_rk, b_q.to(p_q.dtype.element_ty), mask=m_p[:, None, None] & m_k[None, :, :])
    m_s = m_p[:, None] & (o_g * GROUP < N)[None, :]
    tl.store(p_s + o_g[None, :].to(tl.int64) * P + o_r[:, None], b_scale, mask=m_s)


def rms_norm_quantize_fp8(
    x: torch.Tensor,
    weight: torch.Tensor,
    eps: float,
    *,
    residual: torch.Tensor | None = None,
    row_multiple: int = CUBLAS_ROW_MULTIPLE,
) -> tuple[torch.Tensor, torch.Tensor, Fp8Activation]:
    """`rms_norm`, and its output quantized per token and 128-column group to e4m3.

    Args:
        x: [T, N] activations (bf16, fp16 or fp32), unit last stride.
        weight: [N] stored norm weight w (x.dtype or fp32); the effective scale is 1 + w.
        eps: variance epsilon.
        residual: optional [T, N] like x, added to x (in x.dtype) before the norm.
        row_multiple: the quantized rows are T rounded up to a multiple of it (zero rows past T).

    Returns:
        (y, residual_out, y_fp8): y and residual_out as `rms_norm` returns them, bit for bit;
        y_fp8 = `quantize_activation_fp8(y, row_multiple)` bit for bit: e4m3 [P, N] and scales
        [P, ceil(N/128)] fp32 with strides (1, P).
    """
    check_norm_operands("rms_norm_quantize_fp8", x, weight, "residual", residual)
    if x.dim() != 2:
        raise ValueError(f"rms_norm_quantize_fp8: x must be [T, N], got {tuple(x.shape)}")
    if row_multiple < 1:
        raise ValueError(f"rms_norm_quantize_fp8: row_multiple is {row_multiple}; use 1 or more")
    x3 = as_rows(x, "x")
    res3 = as_rows(residual, "residual") if residual is not None else x3
    num_rows, n = x.shape
    p, num_groups = triton.cdiv(num_rows, row_multiple) * row_multiple, triton.cdiv(n, BLOCK)
    y = torch.empty(x.shape, dtype=x.dtype, device=x.device)
    res_out = torch.empty(x.shape, dtype=x.dtype, device=x.device) if residual is not None else x
    q = torch.empty((p, n), dtype=FP8_DTYPE, device=x.device)
    scale = torch.empty((num_groups, p), dtype=torch.float32, device=x.device).t()
    if p == 0 or n == 0:
        return y, res_out, Fp8Activation(q, scale)
    br, bn, _ = norm_tiles(num_rows, n)  # rms_norm's tiles for these rows
    pdl = dependent_launch(x)
    _rms_norm_quantize_kernel[(triton.cdiv(p, br),)](
        x3, res3, weight, y, res_out, q, scale,
        num_rows, p, x3.shape[1], n, eps,
        x3.stride(0), x3.stride(1), res3.stride(0), res3.stride(1),
        HAS_RESIDUAL=residual is not None, BR=br, BN=bn,
        NG=triton.next_power_of_2(num_groups), GROUP=BLOCK, FP8_LIMIT=FP8_MAX, USE_PDL=pdl,
        num_warps=rms_norm_warps(num_rows, bn), launch_pdl=pdl,
    )  # fmt: skip
    return y, res_out, Fp8Activation(q, scale)
