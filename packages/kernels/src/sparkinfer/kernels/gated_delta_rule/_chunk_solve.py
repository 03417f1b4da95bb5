"""WY form of one 64-token chunk of the gated delta rule: T = (I + A)^-1, w and u, in registers.

``_chunk_solve_kernel`` runs once per (value head, chunk). From raw k, g and beta it builds

    A = strictly-lower(beta_i k̂_i·k̂_j exp(g_i - g_j))   (g: the in-chunk gate cumsum)

in 16x16 blocks, inverts I + A (forward substitution on the four diagonal blocks, then dots for
the six below them) and applies the inverse at once: w = T (beta k̂ exp(g)), u = T (beta v). A and
T never leave registers. k̂ = k / ||k|| comes from a Gram matrix of the raw k scaled by the fp32
row norms, so the kernel needs no normalised copy of k; the first value head of each key head
writes that copy (k̂, and q̂ = scale q / ||q||) once, in the input dtype, for the later kernels.
"""

# Triton's annotations misread valid kernel code: constexpr arguments, num_warps/num_stages.
# pyright: reportArgumentType=false, reportCallIssue=false

import triton
import triton.language as tl


@triton.jit
def _chunk_bounds(cu_seqlens, block_seq, block_pos, i_b, BT: tl.constexpr):
    """(sequence index, first token, end of sequence) of global block i_b; sequence -1 = none."""
    i_n = tl.load(block_seq + i_b).to(tl.int64)
    i_n_safe = tl.maximum(i_n, 0)
    bos = tl.load(cu_seqlens + i_n_safe).to(tl.int64)
    eos = tl.load(cu_seqlens + i_n_safe + 1).to(tl.int64)
    t0 = bos + tl.load(block_pos + i_b).to(tl.int64) * BT
    return i_n, t0, eos


@triton.jit
def _load_tile(p, num_rows, stride_r, o_d, m_d, BR: tl.constexpr):
    """[BR, len(o_d)] tile of rows p + r * stride_r (r < num_rows), columns o_d; zero elsewhere.

    p is the tile's first row (64-bit scalar); the in-tile offsets stay 32-bit.
    """
    o_r = tl.arange(0, BR)
    m = (o_r < num_rows)[:, None] & m_d[None, :]
    return tl.load(p + o_r[:, None] * stride_r + o_d[None, :], mask=m, other=0.0)


@triton.jit
def _store_tile(p, num_rows, stride_r, o_d, m_d, b_x):
    """Store b_x [BR, len(o_d)] to rows p + r * stride_r (r < num_rows), columns o_d."""
    o_r = tl.arange(0, b_x.shape[0])
    m = (o_r < num_rows)[:, None] & m_d[None, :]
    tl.store(p + o_r[:, None] * stride_r + o_d[None, :], b_x.to(p.dtype.element_ty), mask=m)


@triton.jit
def _last(b_x, N: tl.constexpr):
    """Last element of a [N] tile."""
    return tl.sum(tl.where(tl.arange(0, N) == N - 1, b_x, 0.0), 0)


@triton.jit
def _inv_norm(b_ss, USE_QK_L2NORM: tl.constexpr):
    """rsqrt(sum(x^2) + 1e-6) per row from its sum of squares; 1 without l2norm."""
    b_n = b_ss * 0.0 + 1.0
    if USE_QK_L2NORM:
        b_n = tl.rsqrt(b_ss + 1e-6)
    return b_n


@triton.jit
def _gates(p_g, p_beta, num_rows, g_base, stride_gt, stride_bt, BC: tl.constexpr):
    """(beta, g cumsum continuing from g_base) of BC rows from p_g / p_beta, fp32."""
    o_r = tl.arange(0, BC)
    m_r = o_r < num_rows
    b_beta = tl.load(p_beta + o_r * stride_bt, mask=m_r, other=0.0).to(tl.float32)
    b_g = tl.load(p_g + o_r * stride_gt, mask=m_r, other=0.0).to(tl.float32)
    return b_beta, g_base + tl.cumsum(b_g, axis=0)


@triton.jit
def _gated_block(b_kk, b_left, b_right, b_gi, b_gj, DIAG: tl.constexpr, BC: tl.constexpr):
    """left_i kk_ij right_j exp(g_i - g_j); a diagonal block keeps only its strictly lower part."""
    b_d = b_gi[:, None] - b_gj[None, :]
    if DIAG:
        o_i = tl.arange(0, BC)
        m_lower = o_i[:, None] > o_i[None, :]
        b_a = tl.where(m_lower, b_kk * tl.exp(tl.where(m_lower, b_d, 0.0)), 0.0)
    else:
        b_a = b_kk * tl.exp(b_d)
    return b_a * b_left[:, None] * b_right[None, :]


@triton.jit
def _substitute_row(b_y, m_row):
    """Row i of Y = (I + N)^-1 - I from the rows above it: -N_i - sum_m N_im Y_m.

    b_y holds the finished rows above i and -N from row i down; m_row selects row i.
    """
    b_r = tl.sum(tl.where(m_row, b_y, 0.0), 0)
    b_r += tl.sum(b_r[:, None] * b_y, 0)
    return tl.where(m_row, b_r[None, :], b_y)


@triton.jit
def _invert_diagonal(b_a0, b_a1, b_a2, b_a3, BC: tl.constexpr):
    """(I + A_jj)^-1 of four strictly-lower [BC, BC] blocks by forward substitution.

    The four substitutions share one loop, so their serial steps overlap.
    """
    o_i = tl.arange(0, BC)
    b_y0, b_y1, b_y2, b_y3 = -b_a0, -b_a1, -b_a2, -b_a3
    # Rows 0 and 1 of Y are -N already.
    for i in range(2, BC):
        m_row = (o_i == i)[:, None]
        b_y0 = _substitute_row(b_y0, m_row)
        b_y1 = _substitute_row(b_y1, m_row)
        b_y2 = _substitute_row(b_y2, m_row)
        b_y3 = _substitute_row(b_y3, m_row)
    eye = (o_i[:, None] == o_i[None, :]).to(tl.float32)
    return b_y0 + eye, b_y1 + eye, b_y2 + eye, b_y3 + eye


@triton.jit
def _mdot(a, b, P: tl.constexpr):
    return tl.dot(a, b, input_precision=P)


@triton.jit
def _store_lower_product(p, num_rows, stride_r, o_d, m_d,
                         t00, t10, t11, t20, t21, t22, t30, t31, t32, t33,
                         x0, x1, x2, x3, BC: tl.constexpr, P: tl.constexpr):  # fmt: skip
    """Store T X for block-lower T (blocks t_ij) and X given as four [BC, BD] row blocks x_j."""
    _store_tile(p, num_rows, stride_r, o_d, m_d, tl.dot(t00, x0, input_precision=P))
    b_y = tl.dot(t11, x1, tl.dot(t10, x0, input_precision=P), input_precision=P)
    _store_tile(p + BC * stride_r, num_rows - BC, stride_r, o_d, m_d, b_y)
    b_y = tl.dot(t20, x0, tl.dot(t21, x1, input_precision=P), input_precision=P)
    b_y = tl.dot(t22, x2, b_y, input_precision=P)
    _store_tile(p + 2 * BC * stride_r, num_rows - 2 * BC, stride_r, o_d, m_d, b_y)
    b_y = tl.dot(t30, x0, tl.dot(t31, x1, input_precision=P), input_precision=P)
    b_y = tl.dot(t33, x3, tl.dot(t32, x2, b_y, input_precision=P), input_precision=P)
    _store_tile(p + 3 * BC * stride_r, num_rows - 3 * BC, stride_r, o_d, m_d, b_y)


@triton.jit
def _store_q_hat(p_q, p_qh, num_rows, stride_qt, scale,
                 H: tl.constexpr, K: tl.constexpr, BK: tl.constexpr, BT: tl.constexpr,
                 BC: tl.constexpr, USE_QK_L2NORM: tl.constexpr):  # fmt: skip
    """q̂ = scale q / ||q|| (fp32, stored in q_hat's dtype) for the BT rows from p_q to p_qh."""
    o_k = tl.arange(0, BK)
    m_k = o_k < K
    for j in range(BT // BC):
        b_q = _load_tile(p_q + j * BC * stride_qt, num_rows - j * BC, stride_qt, o_k, m_k, BC)
        b_q = b_q.to(tl.float32)
        b_n = _inv_norm(tl.sum(b_q * b_q, 1), USE_QK_L2NORM) * scale
        _store_tile(p_qh + j * BC * H * K, num_rows - j * BC, H * K, o_k, m_k, b_q * b_n[:, None])


@triton.jit
def _load_sub_blocks(p, num_rows, stride_r, o_d, m_d, BC: tl.constexpr):
    """The four [BC, len(o_d)] row blocks of a chunk from its first row p, as fp32."""
    x0 = _load_tile(p, num_rows, stride_r, o_d, m_d, BC)
    x1 = _load_tile(p + BC * stride_r, num_rows - BC, stride_r, o_d, m_d, BC)
    x2 = _load_tile(p + 2 * BC * stride_r, num_rows - 2 * BC, stride_r, o_d, m_d, BC)
    x3 = _load_tile(p + 3 * BC * stride_r, num_rows - 3 * BC, stride_r, o_d, m_d, BC)
    return x0.to(tl.float32), x1.to(tl.float32), x2.to(tl.float32), x3.to(tl.float32)


@triton.jit
def _chunk_solve_kernel(
    q, k, v, g, beta, q_hat, k_hat, g_cum, w, u, cu_seqlens, chunk_seq, chunk_pos,
    stride_qt, stride_kt, stride_vt, stride_gt, stride_bt, scale,
    H: tl.constexpr, HV: tl.constexpr, K: tl.constexpr, V: tl.constexpr,
    BK: tl.constexpr, BV: tl.constexpr, BW: tl.constexpr, BT: tl.constexpr, BC: tl.constexpr,
    USE_QK_L2NORM: tl.constexpr, DOT_PRECISION: tl.constexpr, MERGE_PRECISION: tl.constexpr,
    DOT_DTYPE: tl.constexpr,
):  # fmt: skip
    # Value heads of one chunk are neighbours in launch order, so they share k in L2.
    i_hv, i_c = tl.program_id(0).to(tl.int64), tl.program_id(1).to(tl.int64)
    i_h = i_hv // (HV // H)
    is_leader = i_hv % (HV // H) == 0  # writes q̂ and k̂ for its key head
    i_n, t0, eos = _chunk_bounds(cu_seqlens, chunk_seq, chunk_pos, i_c, BT)
    if i_n < 0:
        return
    P: tl.constexpr = DOT_PRECISION
    n = eos - t0  # rows of the chunk that exist; sub-block j holds rows j * BC .. j * BC + BC - 1
    if is_leader:
        _store_q_hat(q + t0 * stride_qt + i_h * K, q_hat + (t0 * H + i_h) * K, n, stride_qt,
                     scale, H, K, BK, BT, BC, USE_QK_L2NORM)  # fmt: skip

    p_g, p_beta = g + t0 * stride_gt + i_hv, beta + t0 * stride_bt + i_hv
    b0, g0 = _gates(p_g, p_beta, n, 0.0, stride_gt, stride_bt, BC)
    b1, g1 = _gates(p_g + BC * stride_gt, p_beta + BC * stride_bt, n - BC, _last(g0, BC),
                    stride_gt, stride_bt, BC)  # fmt: skip
    b2, g2 = _gates(p_g + 2 * BC * stride_gt, p_beta + 2 * BC * stride_bt, n - 2 * BC,
                    _last(g1, BC), stride_gt, stride_bt, BC)  # fmt: skip
    b3, g3 = _gates(p_g + 3 * BC * stride_gt, p_beta + 3 * BC * stride_bt, n - 3 * BC,
                    _last(g2, BC), stride_gt, stride_bt, BC)  # fmt: skip
    o_c = tl.arange(0, BC)
    p_gc = g_cum + t0 * HV + i_hv  # g_cum [T, HV] fp32
    tl.store(p_gc + o_c * HV, g0, mask=o_c < n)
    tl.store(p_gc + (BC + o_c) * HV, g1, mask=BC + o_c < n)
    tl.store(p_gc + (2 * BC + o_c) * HV, g2, mask=2 * BC + o_c < n)
    tl.store(p_gc + (3 * BC + o_c) * HV, g3, mask=3 * BC + o_c < n)

    # Gram blocks kk_ij = k_i k_j^T of the raw k and its row sums of squares, BW columns a step.
    p_k = k + t0 * stride_kt + i_h * K
    kk00 = tl.zeros([BC, BC], dtype=tl.float32)
    kk10, kk11 = tl.zeros_like(kk00), tl.zeros_like(kk00)
    kk20, kk21, kk22 = tl.zeros_like(kk00), tl.zeros_like(kk00), tl.zeros_like(kk00)
    kk30, kk31, kk32, kk33 = (tl.zeros_like(kk00), tl.zeros_like(kk00), tl.zeros_like(kk00),
                              tl.zeros_like(kk00))  # fmt: skip
    ss0 = tl.zeros([BC], dtype=tl.float32)
    ss1, ss2, ss3 = tl.zeros_like(ss0), tl.zeros_like(ss0), tl.zeros_like(ss0)
    for i_k in range(BK // BW):
        o_k = i_k * BW + tl.arange(0, BW)
        x0, x1, x2, x3 = _load_sub_blocks(p_k, n, stride_kt, o_k, o_k < K, BC)
        ss0 += tl.sum(x0 * x0, 1)
        ss1 += tl.sum(x1 * x1, 1)
        ss2 += tl.sum(x2 * x2, 1)
        ss3 += tl.sum(x3 * x3, 1)
        x0, x1 = x0.to(DOT_DTYPE), x1.to(DOT_DTYPE)
        x2, x3 = x2.to(DOT_DTYPE), x3.to(DOT_DTYPE)
        kk00 = tl.dot(x0, tl.trans(x0), kk00, input_precision=P)
        kk10 = tl.dot(x1, tl.trans(x0), kk10, input_precision=P)
        kk11 = tl.dot(x1, tl.trans(x1), kk11, input_precision=P)
        kk20 = tl.dot(x2, tl.trans(x0), kk20, input_precision=P)
        kk21 = tl.dot(x2, tl.trans(x1), kk21, input_precision=P)
        kk22 = tl.dot(x2, tl.trans(x2), kk22, input_precision=P)
        kk30 = tl.dot(x3, tl.trans(x0), kk30, input_precision=P)
        kk31 = tl.dot(x3, tl.trans(x1), kk31, input_precision=P)
        kk32 = tl.dot(x3, tl.trans(x2), kk32, input_precision=P)
        kk33 = tl.dot(x3, tl.trans(x3), kk33, input_precision=P)
    n0, n1 = _inv_norm(ss0, USE_QK_L2NORM), _inv_norm(ss1, USE_QK_L2NORM)
    n2, n3 = _inv_norm(ss2, USE_QK_L2NORM), _inv_norm(ss3, USE_QK_L2NORM)

    # A_ij = beta_i k̂_i k̂_j^T exp(g_i - g_j) with k̂ = n k, then T = (I + A)^-1 block by block.
    t00, t11, t22, t33 = _invert_diagonal(
        _gated_block(kk00, b0 * n0, n0, g0, g0, True, BC),
        _gated_block(kk11, b1 * n1, n1, g1, g1, True, BC),
        _gated_block(kk22, b2 * n2, n2, g2, g2, True, BC),
        _gated_block(kk33, b3 * n3, n3, g3, g3, True, BC),
        BC,
    )
    a10 = _gated_block(kk10, b1 * n1, n0, g1, g0, False, BC)
    a20 = _gated_block(kk20, b2 * n2, n0, g2, g0, False, BC)
    a21 = _gated_block(kk21, b2 * n2, n1, g2, g1, False, BC)
    a30 = _gated_block(kk30, b3 * n3, n0, g3, g0, False, BC)
    a31 = _gated_block(kk31, b3 * n3, n1, g3, g1, False, BC)
    a32 = _gated_block(kk32, b3 * n3, n2, g3, g2, False, BC)
    # T_ij = -T_ii sum_{j <= m < i} A_im T_mj, fp32 (tf32 dots when the result is 16-bit).
    M: tl.constexpr = MERGE_PRECISION
    t10 = -_mdot(_mdot(t11, a10, M), t00, M)
    t21 = -_mdot(_mdot(t22, a21, M), t11, M)
    t32 = -_mdot(_mdot(t33, a32, M), t22, M)
    t20 = -_mdot(t22, _mdot(a20, t00, M) + _mdot(a21, t10, M), M)
    t31 = -_mdot(t33, _mdot(a31, t11, M) + _mdot(a32, t21, M), M)
    t30 = -_mdot(t33, _mdot(a30, t00, M) + _mdot(a31, t10, M) + _mdot(a32, t20, M), M)
    t00, t10, t11 = t00.to(DOT_DTYPE), t10.to(DOT_DTYPE), t11.to(DOT_DTYPE)
    t20, t21, t22 = t20.to(DOT_DTYPE), t21.to(DOT_DTYPE), t22.to(DOT_DTYPE)
    t30, t31, t32, t33 = t30.to(DOT_DTYPE), t31.to(DOT_DTYPE), t32.to(DOT_DTYPE), t33.to(DOT_DTYPE)

    # w = T (beta exp(g) k̂), [T, HV, K]; the leader also stores k̂ [T, H, K].
    e0, e1 = b0 * tl.exp(g0) * n0, b1 * tl.exp(g1) * n1
    e2, e3 = b2 * tl.exp(g2) * n2, b3 * tl.exp(g3) * n3
    p_kh, p_w = k_hat + (t0 * H + i_h) * K, w + (t0 * HV + i_hv) * K
    for i_k in range(BK // BW):
        o_k = i_k * BW + tl.arange(0, BW)
        m_k = o_k < K
        x0, x1, x2, x3 = _load_sub_blocks(p_k, n, stride_kt, o_k, m_k, BC)
        if is_leader:
            _store_tile(p_kh, n, H * K, o_k, m_k, x0 * n0[:, None])
            _store_tile(p_kh + BC * H * K, n - BC, H * K, o_k, m_k, x1 * n1[:, None])
            _store_tile(p_kh + 2 * BC * H * K, n - 2 * BC, H * K, o_k, m_k, x2 * n2[:, None])
            _store_tile(p_kh + 3 * BC * H * K, n - 3 * BC, H * K, o_k, m_k, x3 * n3[:, None])
        _store_lower_product(
            p_w, n, HV * K, o_k, m_k, t00, t10, t11, t20, t21, t22, t30, t31, t32, t33,
            (x0 * e0[:, None]).to(DOT_DTYPE), (x1 * e1[:, None]).to(DOT_DTYPE),
            (x2 * e2[:, None]).to(DOT_DTYPE), (x3 * e3[:, None]).to(DOT_DTYPE), BC, P,
        )  # fmt: skip

    # u = T (beta v), [T, HV, V].
    p_v, p_u = v + t0 * stride_vt + i_hv * V, u + (t0 * HV + i_hv) * V
    for i_v in range(BV // BW):
        o_v = i_v * BW + tl.arange(0, BW)
        m_v = o_v < V
        x0, x1, x2, x3 = _load_sub_blocks(p_v, n, stride_vt, o_v, m_v, BC)
        _store_lower_product(
            p_u, n, HV * V, o_v, m_v, t00, t10, t11, t20, t21, t22, t30, t31, t32, t33,
            (x0 * b0[:, None]).to(DOT_DTYPE), (x1 * b1[:, None]).to(DOT_DTYPE),
            (x2 * b2[:, None]).to(DOT_DTYPE), (x3 * b3[:, None]).to(DOT_DTYPE), BC, P,
        )  # fmt: skip
