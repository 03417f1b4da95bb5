"""Chunked gated-delta-rule prefill (chunk 64, WY/UT form) over a varlen batch, fp32 state pool.

Three kernels, in the spirit of FLA's ``chunk_gated_delta_rule`` (README.md has the details):
1. ``_chunk_solve_kernel`` (``_chunk_solve.py``) per (value head, chunk): gate cumsum, the
   strictly-lower A, T = (I + A)^-1, w = T (beta k̂ exp(g)) and u = T (beta v), all in registers;
   one value head per key head also writes l2-normalised q̂ (scaled) and k̂ once.
2. ``_chunk_state_kernel`` per (sequence, value head, V tile): the sequential inter-chunk state
   recurrence from the slot's initial state to the final state written back to the slot; it
   overwrites u with v_new = u - w S and stores the state entering every output block of
   ``out_chunks`` chunks.
3. ``_chunk_output_kernel`` per (V tile, value head, chunk): o = exp(g) q̂ S + causal(q̂ k̂^T
   exp(g_i - g_j)) v_new over the chunks of its output block up to this one.
Chunk bookkeeping stays on the device (no host sync): programs past the last chunk exit.
"""

# Triton's annotations misread valid kernel code: constexpr arguments, num_warps/num_stages.
# pyright: reportArgumentType=false, reportCallIssue=false

from dataclasses import dataclass
from typing import NamedTuple

import torch
import triton
import triton.language as tl
from sparkinfer.kernels._triton import (
    IndexCache,
    cached_index_tables,
    check_device,
    check_dtype,
    check_last_dim_contiguous,
    check_shape,
    check_varlen_batch,
    dot_dtype,
    num_multiprocessors,
)
from sparkinfer.kernels.gated_delta_rule._chunk_index import chunk_index_tables
from sparkinfer.kernels.gated_delta_rule._chunk_solve import (
    _chunk_bounds,
    _chunk_solve_kernel,
    _load_tile,
    _store_tile,
)
from sparkinfer.kernels.gated_delta_rule.checks import INPUT_DTYPES, check_qkv, check_state_pool
from sparkinfer.kernels.linear.invariant import current_phase

BT = 64  # chunk length
BC = 16  # sub-block of the chunk for the triangular solve
# A solve grid up to this many programs an SM takes ChunkLaunch.few_solve_warps. On the H200
# (48 value heads, 132 SMs) two warps ran a whole 16-, 54- and 200-token prefill 1.21x, 1.14x
# and 1.09x as fast as one (48-192 programs) and a 1,024-token one (768) 0.83x as fast, with the
# same bits (`sparkinfer.lab.kernels.gated_delta_rule --tune`, docs/benchmarks.md).
FEW_SOLVE_PROGRAMS_PER_SM = 2
MAX_GRID_Y = 65535  # CUDA's limit on the second and third grid dimensions


@dataclass(frozen=True)
class ChunkLaunch:
    """Tiles, warps and stages of the three prefill kernels (swept on an H200, see README.md).

    ``chunk_gated_delta_rule`` reads the module constant ``LAUNCH``; a sweep rebinds it to
    ``dataclasses.replace(LAUNCH, ...)`` between calls.
    """

    solve_width: int = 32  # columns of k and v per step of the solve kernel
    solve_warps: int = 1
    # Warps of a solve grid of at most FEW_SOLVE_PROGRAMS_PER_SM programs an SM (a short prompt
    # or a prefix-cache hit's question), outside batch-invariant phases: there a program's
    # latency, not the grid's throughput, sets the time.
    few_solve_warps: int = 2
    state_bv: int = 64  # V tile of the state kernel: B * HV * V / state_bv sequential programs
    state_warps: int = 4
    state_stages: int = 4
    out_chunks: int = 1  # chunks per output block; the state is stored once per block
    out_bk: int = 128  # K step of the output kernel
    out_bv: int = 128
    out_warps: int = 4
    out_stages: int = 2

    def __post_init__(self) -> None:
        for name in ("solve_width", "state_bv", "out_bk", "out_bv"):
            value = getattr(self, name)
            if value < 16 or value & (value - 1):
                raise ValueError(f"ChunkLaunch.{name} is {value}; expected a power of two >= 16")
        for name in ("solve_warps", "few_solve_warps", "state_warps", "out_warps"):
            value = getattr(self, name)
            if value not in (1, 2, 4, 8, 16):
                raise ValueError(f"ChunkLaunch.{name} is {value}; expected 1, 2, 4, 8 or 16")
        if self.out_chunks not in (1, 2, 4, 8):
            raise ValueError(f"ChunkLaunch.out_chunks is {self.out_chunks}; expected 1, 2, 4 or 8")
        if min(self.state_stages, self.out_stages) < 1:
            raise ValueError("ChunkLaunch stages must be at least 1")


LAUNCH = ChunkLaunch()


@triton.jit
def _chunk_state_kernel(
    k_hat, w, uv, g_cum, h, state, cu_seqlens, block_offsets, state_slots, has_initial_state,
    block_chunks,
    H: tl.constexpr, HV: tl.constexpr, K: tl.constexpr, V: tl.constexpr,
    BKH: tl.constexpr, BV: tl.constexpr, BT: tl.constexpr,
    DOT_PRECISION: tl.constexpr, DOT_DTYPE: tl.constexpr,
):  # fmt: skip
    i_v, i_nh = tl.program_id(0).to(tl.int64), tl.program_id(1).to(tl.int64)
    i_n, i_hv = i_nh // HV, i_nh % HV
    i_h = i_hv // (HV // H)
    slot = tl.load(state_slots + i_n).to(tl.int64)
    if slot < 0:
        return
    bos = tl.load(cu_seqlens + i_n).to(tl.int64)
    eos = tl.load(cu_seqlens + i_n + 1).to(tl.int64)
    i_b0 = tl.load(block_offsets + i_n).to(tl.int64)
    P: tl.constexpr = DOT_PRECISION
    # The state is two [BKH, BV] halves, rows 0..BKH-1 and BKH..2 BKH-1 of K, fp32.
    o_k = tl.arange(0, BKH)
    m_k0, m_k1 = o_k < K, BKH + o_k < K
    o_v = tl.arange(0, BV)
    m_v = i_v * BV + o_v < V
    o_c = tl.arange(0, BT)
    # The pool holds S transposed ([V, K]): S[k, v] sits at v * K + k of the head.
    p_state = state + (slot * HV + i_hv) * K * V + i_v * BV * K
    b_h0 = tl.zeros([BKH, BV], dtype=tl.float32)
    b_h1 = tl.zeros([BKH, BV], dtype=tl.float32)
    if tl.load(has_initial_state + i_n) != 0:
        b_h0 = _load_tile(p_state, K, 1, o_v * K, m_v, BKH)
        b_h1 = _load_tile(p_state + BKH, K - BKH, 1, o_v * K, m_v, BKH)

    for i_t in range(tl.cdiv(eos - bos, BT)):
        t0 = bos + i_t * BT
        n = eos - t0
        b_hd0, b_hd1 = b_h0.to(DOT_DTYPE), b_h1.to(DOT_DTYPE)
        if i_t % block_chunks == 0:
            # h [num_blocks, HV, K, V]: the state entering each output block.
            p_h = h + ((i_b0 + i_t // block_chunks) * HV + i_hv) * K * V + i_v * BV
            _store_tile(p_h, K, V, o_v, m_v, b_hd0)
            _store_tile(p_h + BKH * V, K - BKH, V, o_v, m_v, b_hd1)
        # Loads and gates, independent of the state, come before its dots.
        p_w = w + (t0 * HV + i_hv) * K
        b_w0 = _load_tile(p_w, n, HV * K, o_k, m_k0, BT).to(DOT_DTYPE)
        b_w1 = _load_tile(p_w + BKH, n, HV * K, o_k, m_k1, BT).to(DOT_DTYPE)
        p_u = uv + (t0 * HV + i_hv) * V + i_v * BV
        b_u = _load_tile(p_u, n, HV * V, o_v, m_v, BT).to(tl.float32)
        b_g_last = tl.load(g_cum + (tl.minimum(t0 + BT, eos) - 1) * HV + i_hv)
        b_g = tl.load(g_cum + (t0 + o_c) * HV + i_hv, mask=o_c < n, other=0.0)
        b_decay = tl.where(o_c < n, tl.exp(b_g_last - b_g), 0.0)
        p_k = k_hat + (t0 * H + i_h) * K  # k̂^T in two [BKH, BT] halves
        b_k0 = _load_tile(p_k, K, 1, o_c * H * K, o_c < n, BKH).to(DOT_DTYPE)
        b_k1 = _load_tile(p_k + BKH, K - BKH, 1, o_c * H * K, o_c < n, BKH).to(DOT_DTYPE)

        # v_new = u - w S overwrites u; S <- exp(g_last) S + k̂^T (exp(g_last - g) v_new).
        b_v = b_u - tl.dot(b_w1, b_hd1, tl.dot(b_w0, b_hd0, input_precision=P), input_precision=P)
        _store_tile(p_u, n, HV * V, o_v, m_v, b_v)
        b_vd = (b_v * b_decay[:, None]).to(DOT_DTYPE)
        b_scale = tl.exp(b_g_last)
        b_h0 = tl.dot(b_k0, b_vd, b_h0 * b_scale, input_precision=P)
        b_h1 = tl.dot(b_k1, b_vd, b_h1 * b_scale, input_precision=P)
    _store_tile(p_state, K, 1, o_v * K, m_v, b_h0)
    _store_tile(p_state + BKH, K - BKH, 1, o_v * K, m_v, b_h1)


@triton.jit
def _chunk_starts(g_cum, t_b, s, i_hv, HV: tl.constexpr, BT: tl.constexpr, R: tl.constexpr):
    """[R] gate sum from an output block's first token t_b to the start of each of its chunks.

    g_cum restarts every chunk, so chunk j adds the full sums of chunks 0..j-1; only the chunks
    before s (all complete) are read.
    """
    o_j = tl.arange(0, R)
    b_last = tl.load(g_cum + (t_b + (o_j + 1) * BT - 1) * HV + i_hv, mask=o_j < s, other=0.0)
    return tl.cumsum(b_last, 0) - b_last


@triton.jit
def _pick(b_x, i, N: tl.constexpr):
    """Element i of a [N] tile."""
    return tl.sum(tl.where(tl.arange(0, N) == i, b_x, 0.0), 0)


@triton.jit
def _qk_tile(p_q, p_k, p_h, n_q, n_k, o_v, m_v,
             H: tl.constexpr, K: tl.constexpr, V: tl.constexpr, BK: tl.constexpr,
             BT: tl.constexpr, WITH_STATE: tl.constexpr, P: tl.constexpr,
             DOT_DTYPE: tl.constexpr):  # fmt: skip
    """(q̂ k̂^T [BT, BT], q̂ h [BT, BV] if WITH_STATE) for BT query rows at p_q, key rows at p_k."""
    b_s = tl.zeros([BT, BT], dtype=tl.float32)
    b_o = tl.zeros([BT, o_v.shape[0]], dtype=tl.float32)
    for i_k in range(tl.cdiv(K, BK)):
        o_k = i_k * BK + tl.arange(0, BK)
        m_k = o_k < K
        b_q = _load_tile(p_q, n_q, H * K, o_k, m_k, BT).to(DOT_DTYPE)
        b_k = _load_tile(p_k, n_k, H * K, o_k, m_k, BT).to(DOT_DTYPE)
        b_s = tl.dot(b_q, tl.trans(b_k), b_s, input_precision=P)
        if WITH_STATE:
            b_h = _load_tile(p_h + i_k * BK * V, K - i_k * BK, V, o_v, m_v, BK).to(DOT_DTYPE)
            b_o = tl.dot(b_q, b_h, b_o, input_precision=P)
    return b_s, b_o


@triton.jit
def _chunk_output_kernel(
    q_hat, k_hat, v_new, h, g_cum, o, cu_seqlens, chunk_seq, chunk_pos, block_offsets,
    state_slots,
    H: tl.constexpr, HV: tl.constexpr, K: tl.constexpr, V: tl.constexpr,
    BK: tl.constexpr, BV: tl.constexpr, BT: tl.constexpr, R: tl.constexpr,
    DOT_PRECISION: tl.constexpr, DOT_DTYPE: tl.constexpr,
):  # fmt: skip
    # Value heads of one chunk are neighbours in launch order, so they share q̂ and k̂ in L2.
    i_v, i_hv = tl.program_id(0).to(tl.int64), tl.program_id(1).to(tl.int64)
    i_c = tl.program_id(2).to(tl.int64)
    i_h = i_hv // (HV // H)
    i_n, t0, eos = _chunk_bounds(cu_seqlens, chunk_seq, chunk_pos, i_c, BT)
    if i_n < 0:
        return
    P: tl.constexpr = DOT_PRECISION
    n = eos - t0
    o_c = tl.arange(0, BT)
    o_v = tl.arange(0, BV)
    m_v = i_v * BV + o_v < V
    p_o = o + (t0 * HV + i_hv) * V + i_v * BV
    if tl.load(state_slots + i_n) < 0:
        _store_tile(p_o, n, HV * V, o_v, m_v, tl.zeros([BT, BV], dtype=tl.float32))
        return

    # The chunk is number s of its output block of R chunks, which starts at token t_b with the
    # state h[i_hb]: o = exp(g) q̂ S + sum over chunks j <= s of gated q̂ k̂_j^T v_new_j, with g
    # counted from t_b.
    pos = tl.load(chunk_pos + i_c).to(tl.int64)
    s = pos % R
    t_b = t0 - s * BT
    i_hb = tl.load(block_offsets + i_n).to(tl.int64) + pos // R
    b_start = _chunk_starts(g_cum, t_b, s, i_hv, HV, BT, R)
    b_g = tl.load(g_cum + (t0 + o_c) * HV + i_hv, mask=o_c < n, other=0.0)
    b_gi = b_g + _pick(b_start, s, R)
    p_q, p_k = q_hat + (t0 * H + i_h) * K, k_hat + (t_b * H + i_h) * K
    p_h = h + (i_hb * HV + i_hv) * K * V + i_v * BV
    p_v = v_new + (t_b * HV + i_hv) * V + i_v * BV
    b_s, b_o = _qk_tile(p_q, p_k + s * BT * H * K, p_h, n, n, o_v, m_v,
                        H, K, V, BK, BT, True, P, DOT_DTYPE)  # fmt: skip
    b_o *= tl.exp(b_gi)[:, None]
    m_s = (o_c[:, None] >= o_c[None, :]) & (o_c < n)[:, None]
    b_s = tl.where(m_s, b_s * tl.exp(tl.where(m_s, b_g[:, None] - b_g[None, :], 0.0)), 0.0)
    b_v = _load_tile(p_v + s * BT * HV * V, n, HV * V, o_v, m_v, BT).to(DOT_DTYPE)
    b_o = tl.dot(b_s.to(DOT_DTYPE), b_v, b_o, input_precision=P)
    for j in range(s):
        # Chunk j < s of the block is complete: it ends before this chunk starts.
        b_s, _ = _qk_tile(p_q, p_k + j * BT * H * K, p_h, n, BT, o_v, m_v,
                          H, K, V, BK, BT, False, P, DOT_DTYPE)  # fmt: skip
        b_gj = tl.load(g_cum + (t_b + j * BT + o_c) * HV + i_hv) + _pick(b_start, j, R)
        b_s *= tl.exp(tl.where((o_c < n)[:, None], b_gi[:, None] - b_gj[None, :], 0.0))
        b_v = _load_tile(p_v + j * BT * HV * V, BT, HV * V, o_v, m_v, BT).to(DOT_DTYPE)
        b_o = tl.dot(b_s.to(DOT_DTYPE), b_v, b_o, input_precision=P)
    _store_tile(p_o, n, HV * V, o_v, m_v, b_o)


def _index_tables(
    cu_seqlens: torch.Tensor, num_tokens: int, out_chunks: int, index_cache: IndexCache | None
) -> tuple[torch.Tensor, ...]:
    """(chunk_seq, chunk_pos, output-block offsets), shared through ``index_cache``."""
    num_chunks = num_tokens // BT + cu_seqlens.shape[0] - 1
    return cached_index_tables(
        index_cache,
        f"chunk_gated_delta_rule:BT={BT}:out_chunks={out_chunks}",
        cu_seqlens,
        num_chunks,
        lambda: chunk_index_tables(cu_seqlens, num_tokens, BT, BT * out_chunks),
    )


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


def _check_grid(num_tokens: int, num_seqs: int, num_v_heads: int) -> None:
    """The chunks (T // 64 + B) and the state programs (B * HV) fit CUDA's grid dims 2 and 3."""
    op = "chunk_gated_delta_rule"
    if num_tokens // BT + num_seqs > MAX_GRID_Y or num_seqs * num_v_heads > MAX_GRID_Y:
        raise ValueError(
            f"{op}: {num_tokens} tokens in {num_seqs} sequences with HV={num_v_heads}; expected "
            f"T // {BT} + B <= {MAX_GRID_Y} and B * HV <= {MAX_GRID_Y}: split the prefill batch"
        )


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
    index_cache: dict[str, tuple[torch.Tensor, ...]] | None = None,
) -> torch.Tensor:
    """Gated delta rule over a packed (varlen) prefill batch, chunked (64) in WY/UT form.

    Args:
        q: [T, H, K] queries (bf16, fp16 or fp32; rows may be strided, heads dense).
        k: [T, H, K] keys, same dtype and layout rules as q.
        v: [T, HV, V] values; value head j reads key head j // (HV // H).
        g: [T, HV] fp32 log-decay (g <= 0).
        beta: [T, HV] write strength in (0, 1).
        state: [num_slots, HV, V, K] fp32 contiguous state pool (each head's S stored transposed),
            updated in place.
        cu_seqlens: [B + 1] int32 sequence starts in the packed T dimension.
        state_slots: [B] int64 row of ``state`` per sequence; -1 is a padding row (state untouched,
            output zero).
        has_initial_state: [B] bool; True reads the initial state from the slot, False starts at 0.
        scale: query scale; defaults to K ** -0.5.
        use_qk_l2norm: l2-normalise q and k (fp32, eps 1e-6) inside the kernels.
        index_cache: optional dict shared by the calls of one step over the same ``cu_seqlens``
            tensor (e.g. every layer of a forward): the chunk tables derived from cu_seqlens are
            built by the first call, stored there and reused by the others (keyed by tile sizes,
            checked against cu_seqlens and T). Rewriting cu_seqlens in place needs a fresh dict.

    Returns:
        o: [T, HV, V] in v.dtype. Each sequence's final state is written to ``state[slot]``.
    """
    op = "chunk_gated_delta_rule"
    _check_inputs(q, k, v, g, beta, state)
    check_varlen_batch(op, cu_seqlens, state_slots, has_initial_state)
    tensors = {"q": q, "k": k, "v": v, "g": g, "beta": beta, "state": state}
    tensors |= {"cu_seqlens": cu_seqlens, "state_slots": state_slots}
    check_device(op, tensors | {"has_initial_state": has_initial_state})
    _check_grid(q.shape[0], state_slots.shape[0], v.shape[1])
    launch = LAUNCH
    scale = q.shape[2] ** -0.5 if scale is None else scale
    chunk_seq, chunk_pos, block_offsets = _index_tables(
        cu_seqlens, q.shape[0], launch.out_chunks, index_cache
    )
    wy = chunk_wy(q, k, v, g, beta=beta, cu_seqlens=cu_seqlens, chunks=(chunk_seq, chunk_pos),
                  scale=scale, use_qk_l2norm=use_qk_l2norm, launch=launch)  # fmt: skip
    num_blocks = q.shape[0] // (BT * launch.out_chunks) + state_slots.shape[0]
    num_v_heads, head_v = v.shape[1:]
    h = torch.empty(num_blocks, num_v_heads, q.shape[2], head_v, dtype=v.dtype, device=v.device)
    consts = _constants(q, v)
    bk, bv = consts.pop("BK"), consts.pop("BV")
    bv_state = min(bv, launch.state_bv)
    _chunk_state_kernel[(triton.cdiv(head_v, bv_state), state_slots.shape[0] * num_v_heads)](
        wy.k_hat, wy.w, wy.u, wy.g_cum, h, state, cu_seqlens, block_offsets, state_slots,
        has_initial_state.view(torch.uint8), launch.out_chunks, BKH=max(bk, 32) // 2,
        BV=bv_state, **consts, num_warps=launch.state_warps,
        num_stages=launch.state_stages,
    )  # fmt: skip
    o = torch.empty(v.shape, dtype=v.dtype, device=v.device)
    if q.shape[0] > 0:
        bv_out = min(bv, launch.out_bv)
        _chunk_output_kernel[(triton.cdiv(head_v, bv_out), num_v_heads, chunk_seq.shape[0])](
            wy.q_hat, wy.k_hat, wy.u, h, wy.g_cum, o, cu_seqlens, chunk_seq, chunk_pos,
            block_offsets, state_slots, BK=min(bk, launch.out_bk), BV=bv_out,
            R=launch.out_chunks, **consts, num_warps=launch.out_warps,
            num_stages=launch.out_stages,
        )  # fmt: skip
    return o


class ChunkWY(NamedTuple):
    """Per-chunk WY form and normalised inputs, all [T, ...] in the input dtype except g_cum."""

    q_hat: torch.Tensor  # [T, H, K] scale * q / ||q||
    k_hat: torch.Tensor  # [T, H, K] k / ||k||
    g_cum: torch.Tensor  # [T, HV] fp32 gate cumsum from each chunk's first token
    w: torch.Tensor  # [T, HV, K] T (beta exp(g_cum) k̂) per chunk
    u: torch.Tensor  # [T, HV, V] T (beta v) per chunk; the state kernel turns it into v_new


def chunk_wy(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor, *,
             beta: torch.Tensor, cu_seqlens: torch.Tensor, scale: float, use_qk_l2norm: bool,
             launch: ChunkLaunch, chunks: tuple[torch.Tensor, torch.Tensor] | None = None,
             ) -> ChunkWY:  # fmt: skip
    """Run ``_chunk_solve_kernel`` on inputs checked as for ``chunk_gated_delta_rule``.

    Returns the WY form of every 64-token chunk and the normalised q̂, k̂. ``chunks`` is
    (chunk_seq, chunk_pos) of ``chunk_index_tables`` when the caller has them already.
    """
    (num_tokens, num_heads, head_k), (num_v_heads, head_v) = q.shape, v.shape[1:]
    dtype, device = v.dtype, v.device
    q_hat = torch.empty(num_tokens, num_heads, head_k, dtype=dtype, device=device)
    wy = ChunkWY(
        q_hat,
        torch.empty_like(q_hat),
        torch.empty(num_tokens, num_v_heads, dtype=torch.float32, device=device),
        torch.empty(num_tokens, num_v_heads, head_k, dtype=dtype, device=device),
        torch.empty(num_tokens, num_v_heads, head_v, dtype=dtype, device=device),
    )
    if num_tokens == 0:
        return wy
    if chunks is None:
        chunks = chunk_index_tables(cu_seqlens, num_tokens, BT, BT)[:2]
    chunk_seq, chunk_pos = chunks
    consts = _constants(q, v)
    warps = launch.solve_warps
    if current_phase() is None:  # batch-invariant phases keep one launch for every grid
        num_programs = num_v_heads * chunk_seq.shape[0]
        warps = choose_solve_warps(num_programs, num_multiprocessors(device), launch)
    _chunk_solve_kernel[(num_v_heads, chunk_seq.shape[0])](
        q, k, v, g, beta, *wy, cu_seqlens, chunk_seq, chunk_pos,
        q.stride(0), k.stride(0), v.stride(0), g.stride(0), beta.stride(0), scale,
        BW=min(launch.solve_width, consts["BK"], consts["BV"]), BC=BC,
        USE_QK_L2NORM=use_qk_l2norm, MERGE_PRECISION=_merge_precision(dtype),
        **consts, num_warps=warps,
    )  # fmt: skip
    return wy


def choose_solve_warps(num_programs: int, num_sms: int, launch: ChunkLaunch) -> int:
    """Warps of a solve grid of `num_programs` (value head, chunk) programs: few_solve_warps up
    to FEW_SOLVE_PROGRAMS_PER_SM programs an SM, else solve_warps."""
    if num_programs <= FEW_SOLVE_PROGRAMS_PER_SM * num_sms:
        return launch.few_solve_warps
    return launch.solve_warps


def _constants(q: torch.Tensor, v: torch.Tensor) -> dict:
    """Compile-time constants shared by the three kernels."""
    (_, num_heads, head_k), (_, num_v_heads, head_v) = q.shape, v.shape
    consts = {"H": num_heads, "HV": num_v_heads, "K": head_k, "V": head_v, "BT": BT}
    consts |= {"BK": max(16, triton.next_power_of_2(head_k))}
    consts |= {"BV": max(16, triton.next_power_of_2(head_v))}
    return consts | {"DOT_PRECISION": _dot_precision(v.dtype), "DOT_DTYPE": dot_dtype(v)}


def _dot_precision(dtype: torch.dtype) -> str:
    """fp32 inputs get exact fp32 dots; bf16/fp16 dots run on tensor cores (precision unused)."""
    return "ieee" if dtype == torch.float32 else "tf32"


def _merge_precision(dtype: torch.dtype) -> str:
    """fp32 dots of the solve's block merge: tf32 when T is rounded to 16 bits anyway."""
    return "ieee" if dtype == torch.float32 else "tf32"
