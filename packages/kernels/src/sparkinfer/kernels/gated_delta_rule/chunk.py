"""Chunked gated-delta-rule prefill (chunk 64, WY/UT form) over a varlen batch, fp32 state pool.

Three kernels, as in FLA's ``chunk_gated_delta_rule``:
1. ``_chunk_prepare_kernel`` per (chunk, value head): gate cumsum, l2norm of k, the strictly-lower
   A = beta k k^T * exp(g_i - g_j) in 16x16 blocks, and (I + A)^-1 by block forward substitution.
2. ``_chunk_wu_kernel`` per (chunk, value head): w = Ai (beta k exp(g)), u = Ai (beta v).
3. ``_chunk_state_kernel`` per (sequence, value head, V block): the sequential inter-chunk state
   recurrence, from the slot's initial state to the final state written back to the slot; it
   stores the state entering every chunk and v_new = u - w S.
4. ``_chunk_output_kernel`` per (chunk, value head, V block): o = q S + tril(q k^T) v_new, gated.
Chunk bookkeeping stays on the device (no host sync): programs past the last chunk exit.
"""

# Triton's annotations misread valid kernel code: constexpr arguments, num_warps/num_stages.
# pyright: reportArgumentType=false, reportCallIssue=false

import torch
import torch.nn.functional as F
import triton
import triton.language as tl
from sparkinfer.kernels._triton import (
    check_device,
    check_dtype,
    check_last_dim_contiguous,
    check_shape,
    check_varlen_batch,
    dot_dtype,
)
from sparkinfer.kernels.gated_delta_rule.checks import INPUT_DTYPES, check_qkv, check_state_pool

BT = 64  # chunk length
BC = 16  # sub-block of the chunk for the triangular solve
# Tuned on an H200 at T=16K, HV=48, K=V=128, bf16 (README.md here has the measurements).
BV_STATE = 64  # V tile of the sequential state kernel
BV_OUT = 128
WARPS_PREPARE, WARPS_WU, WARPS_STATE, WARPS_OUT = 2, 4, 4, 4


@triton.jit
def _l2norm_rows(b_x, USE_QK_L2NORM: tl.constexpr):
    """x * rsqrt(sum(x^2) + 1e-6) per row of an fp32 tile."""
    if USE_QK_L2NORM:
        b_x = b_x * tl.rsqrt(tl.sum(b_x * b_x, axis=1) + 1e-6)[:, None]
    return b_x


@triton.jit
def _chunk_bounds(cu_seqlens, chunk_seq, chunk_pos, i_c, BT: tl.constexpr):
    """(sequence index, first token, end of sequence) of global chunk i_c; sequence -1 = none."""
    i_n = tl.load(chunk_seq + i_c).to(tl.int64)
    i_n_safe = tl.maximum(i_n, 0)
    bos = tl.load(cu_seqlens + i_n_safe).to(tl.int64)
    eos = tl.load(cu_seqlens + i_n_safe + 1).to(tl.int64)
    t0 = bos + tl.load(chunk_pos + i_c).to(tl.int64) * BT
    return i_n, t0, eos


@triton.jit
def _load_k_block(k, o_t, m_t, i_h, stride_kt, K: tl.constexpr, BK: tl.constexpr,
                  USE_QK_L2NORM: tl.constexpr):  # fmt: skip
    """Rows o_t of key head i_h as fp32 [len(o_t), BK], l2-normalised."""
    o_k = tl.arange(0, BK)
    p_k = k + o_t[:, None] * stride_kt + i_h * K + o_k[None, :]
    b_k = tl.load(p_k, mask=m_t[:, None] & (o_k < K)[None, :], other=0.0).to(tl.float32)
    return _l2norm_rows(b_k, USE_QK_L2NORM)


@triton.jit
def _last(b_x, N: tl.constexpr):
    """Last element of a [N] tile."""
    return tl.sum(tl.where(tl.arange(0, N) == N - 1, b_x, 0.0), 0)


@triton.jit
def _sub_block(k_h, g_h, beta_h, o_t, eos, g_base, stride_kt, stride_gt, stride_bt,
               K: tl.constexpr, BK: tl.constexpr, USE_QK_L2NORM: tl.constexpr,
               DOT_DTYPE: tl.constexpr):  # fmt: skip
    """Rows o_t of one head: (k normalised, in DOT_DTYPE; beta; g cumsum continuing g_base)."""
    m_t = o_t < eos
    b_k = _load_k_block(k_h, o_t, m_t, 0, stride_kt, K, BK, USE_QK_L2NORM)
    b_beta = tl.load(beta_h + o_t * stride_bt, mask=m_t, other=0.0).to(tl.float32)
    b_g = tl.load(g_h + o_t * stride_gt, mask=m_t, other=0.0).to(tl.float32)
    return b_k.to(DOT_DTYPE), b_beta, g_base + tl.cumsum(b_g, axis=0)


@triton.jit
def _block_a(b_ki, b_betai, b_gi, b_kj, b_gj, DIAG: tl.constexpr, BC: tl.constexpr,
             DOT_PRECISION: tl.constexpr):  # fmt: skip
    """Block (i, j) of A = beta_i k_i k_j^T exp(g_i - g_j), strictly lower on the diagonal."""
    b_a = tl.dot(b_ki, tl.trans(b_kj), input_precision=DOT_PRECISION) * b_betai[:, None]
    b_d = b_gi[:, None] - b_gj[None, :]
    if DIAG:
        o_i = tl.arange(0, BC)
        m_lower = o_i[:, None] > o_i[None, :]
        b_a = tl.where(m_lower, b_a * tl.exp(tl.where(m_lower, b_d, 0.0)), 0.0)
    else:
        b_a = b_a * tl.exp(b_d)
    return b_a


@triton.jit
def _invert_unit_lower(b_n, BC: tl.constexpr):
    """(I + N)^-1 for strictly lower N [BC, BC] by forward substitution, one row per step."""
    o_i = tl.arange(0, BC)
    b_y = -b_n
    for i in range(2, BC):
        b_row = tl.sum(tl.where(o_i[:, None] == i, b_y, 0.0), 0)
        b_row = b_row + tl.sum(b_row[:, None] * b_y, 0)
        b_y = tl.where(o_i[:, None] == i, b_row[None, :], b_y)
    return b_y + (o_i[:, None] == o_i[None, :]).to(tl.float32)


@triton.jit
def _dot(a, b):
    return tl.dot(a, b, input_precision="ieee")


@triton.jit
def _store_rows(p, b_x, m_t):
    tl.store(p, b_x.to(p.dtype.element_ty), mask=m_t[:, None])


@triton.jit
def _chunk_prepare_kernel(
    k, g, beta, g_cum, a_inv, cu_seqlens, chunk_seq, chunk_pos,
    stride_kt, stride_gt, stride_bt,
    H: tl.constexpr, HV: tl.constexpr, K: tl.constexpr, BK: tl.constexpr,
    BT: tl.constexpr, BC: tl.constexpr,
    USE_QK_L2NORM: tl.constexpr, DOT_PRECISION: tl.constexpr, DOT_DTYPE: tl.constexpr,
):  # fmt: skip
    i_c, i_hv = tl.program_id(0).to(tl.int64), tl.program_id(1).to(tl.int64)
    i_h = i_hv // (HV // H)
    i_n, t0, eos = _chunk_bounds(cu_seqlens, chunk_seq, chunk_pos, i_c, BT)
    if i_n < 0:
        return
    # fmt: off
    k_h, g_h, beta_h = k + i_h * K, g + i_hv, beta + i_hv
    o_t = t0 + tl.arange(0, BC)
    k0, b0, g0 = _sub_block(k_h, g_h, beta_h, o_t, eos, 0.0,
                            stride_kt, stride_gt, stride_bt, K, BK, USE_QK_L2NORM, DOT_DTYPE)
    k1, b1, g1 = _sub_block(k_h, g_h, beta_h, o_t + BC, eos, _last(g0, BC),
                            stride_kt, stride_gt, stride_bt, K, BK, USE_QK_L2NORM, DOT_DTYPE)
    k2, b2, g2 = _sub_block(k_h, g_h, beta_h, o_t + 2 * BC, eos, _last(g1, BC),
                            stride_kt, stride_gt, stride_bt, K, BK, USE_QK_L2NORM, DOT_DTYPE)
    k3, b3, g3 = _sub_block(k_h, g_h, beta_h, o_t + 3 * BC, eos, _last(g2, BC),
                            stride_kt, stride_gt, stride_bt, K, BK, USE_QK_L2NORM, DOT_DTYPE)
    # fmt: on

    P: tl.constexpr = DOT_PRECISION
    ai00 = _invert_unit_lower(_block_a(k0, b0, g0, k0, g0, True, BC, P), BC)
    ai11 = _invert_unit_lower(_block_a(k1, b1, g1, k1, g1, True, BC, P), BC)
    ai22 = _invert_unit_lower(_block_a(k2, b2, g2, k2, g2, True, BC, P), BC)
    ai33 = _invert_unit_lower(_block_a(k3, b3, g3, k3, g3, True, BC, P), BC)
    a10 = _block_a(k1, b1, g1, k0, g0, False, BC, P)
    a20 = _block_a(k2, b2, g2, k0, g0, False, BC, P)
    a21 = _block_a(k2, b2, g2, k1, g1, False, BC, P)
    a30 = _block_a(k3, b3, g3, k0, g0, False, BC, P)
    a31 = _block_a(k3, b3, g3, k1, g1, False, BC, P)
    a32 = _block_a(k3, b3, g3, k2, g2, False, BC, P)
    # Block forward substitution: Ai_ij = -Ai_ii sum_{j <= m < i} A_im Ai_mj.
    ai10 = -_dot(ai11, _dot(a10, ai00))
    ai21 = -_dot(ai22, _dot(a21, ai11))
    ai32 = -_dot(ai33, _dot(a32, ai22))
    ai20 = -_dot(ai22, _dot(a20, ai00) + _dot(a21, ai10))
    ai31 = -_dot(ai33, _dot(a31, ai11) + _dot(a32, ai21))
    ai30 = -_dot(ai33, _dot(a30, ai00) + _dot(a31, ai10) + _dot(a32, ai20))

    # a_inv [T, HV, BT]: row t holds row (t - t0) of the chunk's inverse; upper blocks are unused.
    o_r = tl.arange(0, BC)
    o_t = t0 + o_r
    p_row = a_inv + (o_t * HV + i_hv)[:, None] * BT + o_r[None, :]
    p_g = g_cum + o_t * HV + i_hv
    tl.store(p_g, g0, mask=o_t < eos)
    _store_rows(p_row, ai00, o_t < eos)
    o_t += BC
    p_row += BC * HV * BT
    tl.store(p_g + BC * HV, g1, mask=o_t < eos)
    _store_rows(p_row, ai10, o_t < eos)
    _store_rows(p_row + BC, ai11, o_t < eos)
    o_t += BC
    p_row += BC * HV * BT
    tl.store(p_g + 2 * BC * HV, g2, mask=o_t < eos)
    _store_rows(p_row, ai20, o_t < eos)
    _store_rows(p_row + BC, ai21, o_t < eos)
    _store_rows(p_row + 2 * BC, ai22, o_t < eos)
    o_t += BC
    p_row += BC * HV * BT
    tl.store(p_g + 3 * BC * HV, g3, mask=o_t < eos)
    _store_rows(p_row, ai30, o_t < eos)
    _store_rows(p_row + BC, ai31, o_t < eos)
    _store_rows(p_row + 2 * BC, ai32, o_t < eos)
    _store_rows(p_row + 3 * BC, ai33, o_t < eos)


@triton.jit
def _chunk_wu_kernel(
    k, v, beta, g_cum, a_inv, w, u, cu_seqlens, chunk_seq, chunk_pos,
    stride_kt, stride_vt, stride_bt,
    H: tl.constexpr, HV: tl.constexpr, K: tl.constexpr, V: tl.constexpr,
    BK: tl.constexpr, BV: tl.constexpr, BT: tl.constexpr,
    USE_QK_L2NORM: tl.constexpr, DOT_PRECISION: tl.constexpr, DOT_DTYPE: tl.constexpr,
):  # fmt: skip
    i_c, i_hv = tl.program_id(0).to(tl.int64), tl.program_id(1).to(tl.int64)
    i_h = i_hv // (HV // H)
    i_n, t0, eos = _chunk_bounds(cu_seqlens, chunk_seq, chunk_pos, i_c, BT)
    if i_n < 0:
        return
    o_r = tl.arange(0, BT)
    o_t = t0 + o_r
    m_t = o_t < eos
    dt = k.dtype.element_ty
    p_a = a_inv + (o_t * HV + i_hv)[:, None] * BT + o_r[None, :]
    m_a = m_t[:, None] & (o_r[:, None] >= o_r[None, :])
    b_ai = tl.where(m_a, tl.load(p_a, mask=m_a, other=0.0), 0.0).to(DOT_DTYPE)  # [BT, BT] lower
    b_beta = tl.load(beta + o_t * stride_bt + i_hv, mask=m_t, other=0.0).to(tl.float32)
    b_g = tl.load(g_cum + o_t * HV + i_hv, mask=m_t, other=0.0)

    b_k = _load_k_block(k, o_t, m_t, i_h, stride_kt, K, BK, USE_QK_L2NORM)
    b_kb = (b_k * (b_beta * tl.exp(b_g))[:, None]).to(DOT_DTYPE)
    b_w = tl.dot(b_ai, b_kb, input_precision=DOT_PRECISION)  # [BT, BK]
    o_k = tl.arange(0, BK)
    p_w = w + (o_t * HV + i_hv)[:, None] * K + o_k[None, :]
    tl.store(p_w, b_w.to(dt), mask=m_t[:, None] & (o_k < K)[None, :])

    for i_v in range(tl.cdiv(V, BV)):
        o_v = i_v * BV + tl.arange(0, BV)
        m_tv = m_t[:, None] & (o_v < V)[None, :]
        p_v = v + o_t[:, None] * stride_vt + i_hv * V + o_v[None, :]
        b_vb = tl.load(p_v, mask=m_tv, other=0.0).to(tl.float32) * b_beta[:, None]
        b_vb = b_vb.to(DOT_DTYPE)
        b_u = tl.dot(b_ai, b_vb, input_precision=DOT_PRECISION)
        p_u = u + (o_t * HV + i_hv)[:, None] * V + o_v[None, :]
        tl.store(p_u, b_u.to(dt), mask=m_tv)


@triton.jit
def _chunk_state_kernel(
    k, w, u, g_cum, h, v_new, state, cu_seqlens, chunk_offsets, state_slots, has_initial_state,
    stride_kt,
    H: tl.constexpr, HV: tl.constexpr, K: tl.constexpr, V: tl.constexpr,
    BK: tl.constexpr, BV: tl.constexpr, BT: tl.constexpr,
    USE_QK_L2NORM: tl.constexpr, DOT_PRECISION: tl.constexpr, DOT_DTYPE: tl.constexpr,
):  # fmt: skip
    i_v, i_nh = tl.program_id(0).to(tl.int64), tl.program_id(1).to(tl.int64)
    i_n, i_hv = i_nh // HV, i_nh % HV
    i_h = i_hv // (HV // H)
    slot = tl.load(state_slots + i_n).to(tl.int64)
    if slot < 0:
        return
    bos = tl.load(cu_seqlens + i_n).to(tl.int64)
    eos = tl.load(cu_seqlens + i_n + 1).to(tl.int64)
    c0 = tl.load(chunk_offsets + i_n).to(tl.int64)
    dt = k.dtype.element_ty
    o_k = tl.arange(0, BK)
    o_v = i_v * BV + tl.arange(0, BV)
    m_kv = (o_k < K)[:, None] & (o_v < V)[None, :]
    o_kv = o_k[:, None] * V + o_v[None, :]  # offsets inside one [K, V] head
    p_state = state + (slot * HV + i_hv) * K * V + o_kv
    b_h = tl.zeros([BK, BV], dtype=tl.float32)
    if tl.load(has_initial_state + i_n) != 0:
        b_h = tl.load(p_state, mask=m_kv, other=0.0)

    for i_t in range(tl.cdiv(eos - bos, BT)):
        # h [num_chunks, HV, K, V]: the state entering each chunk, for the output kernel.
        tl.store(h + ((c0 + i_t) * HV + i_hv) * K * V + o_kv, b_h.to(dt), mask=m_kv)
        o_t = bos + i_t * BT + tl.arange(0, BT)
        m_t = o_t < eos
        p_w = w + (o_t * HV + i_hv)[:, None] * K + o_k[None, :]
        b_w = tl.load(p_w, mask=m_t[:, None] & (o_k < K)[None, :], other=0.0).to(DOT_DTYPE)
        m_tv = m_t[:, None] & (o_v < V)[None, :]
        p_u = u + (o_t * HV + i_hv)[:, None] * V + o_v[None, :]
        b_v = tl.load(p_u, mask=m_tv, other=0.0).to(tl.float32)
        b_v -= tl.dot(b_w, b_h.to(DOT_DTYPE), input_precision=DOT_PRECISION)
        tl.store(v_new + (o_t * HV + i_hv)[:, None] * V + o_v[None, :], b_v.to(dt), mask=m_tv)

        t_last = tl.minimum(bos + i_t * BT + BT, eos) - 1
        b_g_last = tl.load(g_cum + t_last * HV + i_hv)
        b_g = tl.load(g_cum + o_t * HV + i_hv, mask=m_t, other=0.0)
        b_v = tl.where(m_t[:, None], b_v * tl.exp(b_g_last - b_g)[:, None], 0.0)
        b_k = _load_k_block(k, o_t, m_t, i_h, stride_kt, K, BK, USE_QK_L2NORM).to(DOT_DTYPE)
        b_h = b_h * tl.exp(b_g_last)
        b_h += tl.dot(tl.trans(b_k), b_v.to(DOT_DTYPE), input_precision=DOT_PRECISION)
    tl.store(p_state, b_h, mask=m_kv)


@triton.jit
def _chunk_output_kernel(
    q, k, v_new, h, g_cum, o, cu_seqlens, chunk_seq, chunk_pos, state_slots,
    stride_qt, stride_kt, scale,
    H: tl.constexpr, HV: tl.constexpr, K: tl.constexpr, V: tl.constexpr,
    BK: tl.constexpr, BV: tl.constexpr, BT: tl.constexpr,
    USE_QK_L2NORM: tl.constexpr, DOT_PRECISION: tl.constexpr, DOT_DTYPE: tl.constexpr,
):  # fmt: skip
    i_v, i_c = tl.program_id(0).to(tl.int64), tl.program_id(1).to(tl.int64)
    i_hv = tl.program_id(2).to(tl.int64)
    i_h = i_hv // (HV // H)
    i_n, t0, eos = _chunk_bounds(cu_seqlens, chunk_seq, chunk_pos, i_c, BT)
    if i_n < 0:
        return
    dt = k.dtype.element_ty
    o_r = tl.arange(0, BT)
    o_t = t0 + o_r
    m_t = o_t < eos
    o_v = i_v * BV + tl.arange(0, BV)
    m_tv = m_t[:, None] & (o_v < V)[None, :]
    p_o = o + (o_t * HV + i_hv)[:, None] * V + o_v[None, :]
    if tl.load(state_slots + i_n) < 0:
        tl.store(p_o, tl.zeros([BT, BV], dtype=tl.float32).to(dt), mask=m_tv)
        return
    b_q = _load_k_block(q, o_t, m_t, i_h, stride_qt, K, BK, USE_QK_L2NORM).to(DOT_DTYPE)
    b_k = _load_k_block(k, o_t, m_t, i_h, stride_kt, K, BK, USE_QK_L2NORM).to(DOT_DTYPE)
    b_g = tl.load(g_cum + o_t * HV + i_hv, mask=m_t, other=0.0)

    o_k = tl.arange(0, BK)
    m_kv = (o_k < K)[:, None] & (o_v < V)[None, :]
    p_h = h + (i_c * HV + i_hv) * K * V + o_k[:, None] * V + o_v[None, :]
    b_h = tl.load(p_h, mask=m_kv, other=0.0).to(DOT_DTYPE)
    b_o = tl.dot(b_q, b_h, input_precision=DOT_PRECISION) * tl.exp(b_g)[:, None]
    m_causal = (o_r[:, None] >= o_r[None, :]) & m_t[:, None]
    b_qk = tl.dot(b_q, tl.trans(b_k), input_precision=DOT_PRECISION)
    b_qk = tl.where(
        m_causal, b_qk * tl.exp(tl.where(m_causal, b_g[:, None] - b_g[None, :], 0.0)), 0.0
    )
    p_v = v_new + (o_t * HV + i_hv)[:, None] * V + o_v[None, :]
    b_v = tl.load(p_v, mask=m_tv, other=0.0)
    b_o += tl.dot(b_qk.to(DOT_DTYPE), b_v.to(DOT_DTYPE), input_precision=DOT_PRECISION)
    tl.store(p_o, (b_o * scale).to(dt), mask=m_tv)


def _chunk_table(cu_seqlens: torch.Tensor, num_tokens: int) -> tuple[torch.Tensor, ...]:
    """Device-side chunk bookkeeping, no host sync.

    Returns (chunk_seq, chunk_pos, chunk_offsets): for each of the T // BT + B possible chunks its
    sequence (-1 past the last chunk) and position in that sequence, and [B + 1] first chunk of
    each sequence.
    """
    num_seqs = cu_seqlens.shape[0] - 1
    lens = (cu_seqlens[1:] - cu_seqlens[:-1]).long()
    chunk_offsets = F.pad(torch.cumsum(triton.cdiv(lens, BT), 0), (1, 0))
    chunk_ids = torch.arange(num_tokens // BT + num_seqs, device=cu_seqlens.device)
    seq = torch.searchsorted(chunk_offsets[1:], chunk_ids, right=True)
    seq_safe = seq.clamp(max=max(num_seqs - 1, 0))
    chunk_pos = (chunk_ids - chunk_offsets[seq_safe]).to(torch.int32)
    chunk_seq = torch.where(seq < num_seqs, seq, -1).to(torch.int32)
    return chunk_seq, chunk_pos, chunk_offsets


def _check_inputs(q, k, v, g, beta, state) -> None:
    op = "chunk_gated_delta_rule"
    check_qkv(op, q, k, v, rows="T")
    if k.dtype != q.dtype or v.dtype != q.dtype:
        raise TypeError(f"{op}: q, k, v have dtypes {q.dtype}, {k.dtype}, {v.dtype}; expected one")
    check_dtype(op, "g", g, (torch.float32,))
    check_dtype(op, "beta", beta, INPUT_DTYPES)
    for name, t in (("g", g), ("beta", beta)):
        check_shape(op, name, t, tuple(v.shape[:2]))
        check_last_dim_contiguous(op, name, t)
    check_state_pool(op, state, v, q.shape[2])


def chunk_gated_delta_rule(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    state: torch.Tensor,
    *,
    cu_seqlens: torch.Tensor,
    state_slots: torch.Tensor,
    has_initial_state: torch.Tensor,
    scale: float | None = None,
    use_qk_l2norm: bool = True,
) -> torch.Tensor:
    """Gated delta rule over a packed (varlen) prefill batch, chunked (64) in WY/UT form.

    Args:
        q: [T, H, K] queries (bf16, fp16 or fp32; rows may be strided, heads dense).
        k: [T, H, K] keys, same dtype and layout rules as q.
        v: [T, HV, V] values; value head j reads key head j // (HV // H).
        g: [T, HV] fp32 log-decay (g <= 0).
        beta: [T, HV] write strength in (0, 1).
        state: [num_slots, HV, K, V] fp32 contiguous state pool, updated in place.
        cu_seqlens: [B + 1] int32 sequence starts in the packed T dimension.
        state_slots: [B] int64 row of ``state`` per sequence; -1 is a padding row (state untouched,
            output zero).
        has_initial_state: [B] bool; True reads the initial state from the slot, False starts at 0.
        scale: query scale; defaults to K ** -0.5.
        use_qk_l2norm: l2-normalise q and k (fp32, eps 1e-6) inside the kernels.

    Returns:
        o: [T, HV, V] in v.dtype. Each sequence's final state is written to ``state[slot]``.
    """
    op = "chunk_gated_delta_rule"
    _check_inputs(q, k, v, g, beta, state)
    check_varlen_batch(op, cu_seqlens, state_slots, has_initial_state)
    tensors = {"q": q, "k": k, "v": v, "g": g, "beta": beta, "state": state}
    tensors |= {"cu_seqlens": cu_seqlens, "state_slots": state_slots}
    check_device(op, tensors | {"has_initial_state": has_initial_state})

    num_tokens, num_heads, head_k = q.shape
    num_v_heads, head_v = v.shape[1:]
    num_seqs = state_slots.shape[0]
    scale = head_k**-0.5 if scale is None else scale
    chunk_seq, chunk_pos, chunk_offsets = _chunk_table(cu_seqlens, num_tokens)
    num_chunks = chunk_seq.shape[0]
    dtype, device = v.dtype, v.device
    g_cum = torch.empty(num_tokens, num_v_heads, dtype=torch.float32, device=device)
    a_inv = torch.empty(num_tokens, num_v_heads, BT, dtype=dtype, device=device)
    w = torch.empty(num_tokens, num_v_heads, head_k, dtype=dtype, device=device)
    u = torch.empty(num_tokens, num_v_heads, head_v, dtype=dtype, device=device)
    v_new = torch.empty_like(u)
    h = torch.empty(num_chunks, num_v_heads, head_k, head_v, dtype=dtype, device=device)
    o = torch.empty(num_tokens, num_v_heads, head_v, dtype=dtype, device=device)
    table = (cu_seqlens, chunk_seq, chunk_pos)
    BK = triton.next_power_of_2(head_k)
    BV = triton.next_power_of_2(head_v)
    consts = {"H": num_heads, "HV": num_v_heads, "K": head_k, "BK": BK, "BT": BT}
    consts |= {"USE_QK_L2NORM": use_qk_l2norm, "DOT_PRECISION": _dot_precision(dtype)}
    consts |= {"DOT_DTYPE": dot_dtype(v)}
    if num_tokens > 0:
        _chunk_prepare_kernel[(num_chunks, num_v_heads)](
            k, g, beta, g_cum, a_inv, *table, k.stride(0), g.stride(0), beta.stride(0),
            BC=BC, **consts, num_warps=WARPS_PREPARE,
        )  # fmt: skip
        _chunk_wu_kernel[(num_chunks, num_v_heads)](
            k, v, beta, g_cum, a_inv, w, u, *table, k.stride(0), v.stride(0), beta.stride(0),
            V=head_v, BV=min(BV, 64), **consts, num_warps=WARPS_WU,
        )  # fmt: skip
    bv_state = min(BV, BV_STATE)
    _chunk_state_kernel[(triton.cdiv(head_v, bv_state), num_seqs * num_v_heads)](
        k, w, u, g_cum, h, v_new, state, cu_seqlens, chunk_offsets, state_slots,
        has_initial_state.view(torch.uint8), k.stride(0),
        V=head_v, BV=bv_state, **consts, num_warps=WARPS_STATE, num_stages=2,
    )  # fmt: skip
    if num_tokens > 0:
        bv_out = min(BV, BV_OUT)
        _chunk_output_kernel[(triton.cdiv(head_v, bv_out), num_chunks, num_v_heads)](
            q, k, v_new, h, g_cum, o, *table, state_slots,
            q.stride(0), k.stride(0), scale, V=head_v, BV=bv_out, **consts, num_warps=WARPS_OUT,
        )  # fmt: skip
    return o


def _dot_precision(dtype: torch.dtype) -> str:
    """fp32 inputs get exact fp32 dots; bf16/fp16 dots run on tensor cores (precision unused)."""
    return "ieee" if dtype == torch.float32 else "tf32"
