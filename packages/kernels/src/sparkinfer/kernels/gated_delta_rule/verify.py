"""Recurrent gated delta rule for speculative verify: every position of a sequence in one launch,
the state left as it was; then a commit that replays the accepted positions into the slot.

`fused_recurrent_gated_delta_rule_verify`: one program per (V block, sequence x value head) reads
its [BV, K] tile of the fp32 state once, runs the sequence's T positions one after the other in
registers, writes each position's output and never writes the state back: the slot keeps the
state before the step, whatever the sampler then accepts.
`fused_recurrent_gated_delta_rule_commit`: after acceptance the same programs apply a sequence's
first `num_kept` positions (its input token and the accepted drafts) to the state in its slot,
from the post-conv k, v and the gate inputs a, b the verify read (the caller keeps them).

Both run each token through `_delta_rule_token`, the decode kernel's own update, with the decode
kernel's loads (`_load_key`, `_load_gates`) and its tile (EARLY_STATE_V_TILE rows, NUM_WARPS): a
verify row's output has the bits of a one-token decode step at that position (the decode
kernel's output before its gated norm; the launcher runs the norm after, as decode does inside
`batch_invariant` and above NORM_IN_KERNEL_MAX_SEQS sequences), and the state after the commit
has the bits of num_kept decode steps.

State traffic per sequence and step for a [HV, V, K] fp32 state of S bytes: S read by the verify,
S read and S written by the commit (3 S), against (T + 1) S read and written position by position
plus a copy per position to a roll-back row.
"""

# Triton's annotations misread valid kernel code: num_warps, constexpr branches.
# pyright: reportCallIssue=false

import torch
import triton
import triton.language as tl
from sparkinfer.kernels._triton import check_contiguous, check_device, check_dtype, check_shape
from sparkinfer.kernels.gated_delta_rule.checks import check_qkv, check_state_pool
from sparkinfer.kernels.gated_delta_rule.gating import check_gate_inputs
from sparkinfer.kernels.gated_delta_rule.recurrent import (
    EARLY_STATE_V_TILE,
    NUM_WARPS,
    _check_norm,
    _delta_rule_token,
    _load_gates,
    _load_key,
)
from sparkinfer.kernels.rms_norm.fused import gated_rms_norm


@triton.jit(do_not_specialize=["T"])  # positions of the step: one build for all
def _recurrent_verify_kernel(
    q, k, v, a, b, A_log, dt_bias, state, state_slots, verify_rows, o, T,
    stride_qb, stride_kb, stride_vb, stride_ab, stride_bb, scale,
    H: tl.constexpr, HV: tl.constexpr, K: tl.constexpr, V: tl.constexpr,
    BK: tl.constexpr, BV: tl.constexpr, USE_QK_L2NORM: tl.constexpr,
):  # fmt: skip
    i_v, i_nh = tl.program_id(0).to(tl.int64), tl.program_id(1).to(tl.int64)
    i_n, i_hv = i_nh // HV, i_nh % HV
    i_h = i_hv // (HV // H)
    o_k = tl.arange(0, BK)
    o_v = i_v * BV + tl.arange(0, BV)
    m_k, m_v = o_k < K, o_v < V
    m_vk = m_v[:, None] & m_k[None, :]
    slot = tl.load(state_slots + i_n).to(tl.int64)
    p_rows = verify_rows + i_n * T
    if slot < 0:  # a padding sequence: zero output on each of its rows
        for t in range(0, T):
            row = tl.load(p_rows + t).to(tl.int64)
            if row >= 0:
                p_o = o + (row * HV + i_hv) * V + o_v
                tl.store(p_o, tl.zeros([BV], dtype=tl.float32).to(o.dtype.element_ty), mask=m_v)
        return
    o_vk = o_v[:, None] * K + o_k[None, :]
    b_h = tl.load(state + (slot * HV + i_hv) * K * V + o_vk, mask=m_vk, other=0.0)
    for t in range(0, T):
        row = tl.load(p_rows + t).to(tl.int64)
        if row >= 0:
            b_q = _load_key(q + row * stride_qb + i_h * K + o_k, m_k, USE_QK_L2NORM) * scale
            b_k = _load_key(k + row * stride_kb + i_h * K + o_k, m_k, USE_QK_L2NORM)
            p_v = v + row * stride_vb + i_hv * V + o_v
            b_v = tl.load(p_v, mask=m_v, other=0.0).to(tl.float32)
            b_g, b_beta = _load_gates(a, b, A_log, dt_bias, row, i_hv, stride_ab, stride_bb)
            b_h = _delta_rule_token(b_h, b_k, b_v, b_g, b_beta)
            b_o = tl.sum(b_h * b_q[None, :], 1)
            tl.store(o + (row * HV + i_hv) * V + o_v, b_o.to(o.dtype.element_ty), mask=m_v)


@triton.jit(do_not_specialize=["T"])
def _recurrent_commit_kernel(
    k, v, a, b, A_log, dt_bias, state, state_slots, verify_rows, num_kept, T,
    stride_kb, stride_vb, stride_ab, stride_bb,
    H: tl.constexpr, HV: tl.constexpr, K: tl.constexpr, V: tl.constexpr,
    BK: tl.constexpr, BV: tl.constexpr, USE_QK_L2NORM: tl.constexpr,
):  # fmt: skip
    i_v, i_nh = tl.program_id(0).to(tl.int64), tl.program_id(1).to(tl.int64)
    i_n, i_hv = i_nh // HV, i_nh % HV
    i_h = i_hv // (HV // H)
    slot = tl.load(state_slots + i_n).to(tl.int64)
    n = tl.load(num_kept + i_n).to(tl.int32)
    if (slot < 0) | (n <= 0):
        return
    o_k = tl.arange(0, BK)
    o_v = i_v * BV + tl.arange(0, BV)
    m_k, m_v = o_k < K, o_v < V
    m_vk = m_v[:, None] & m_k[None, :]
    p_state = state + (slot * HV + i_hv) * K * V + o_v[:, None] * K + o_k[None, :]
    b_h = tl.load(p_state, mask=m_vk, other=0.0)
    p_rows = verify_rows + i_n * T
    for t in range(0, n):
        row = tl.load(p_rows + t).to(tl.int64)
        b_k = _load_key(k + row * stride_kb + i_h * K + o_k, m_k, USE_QK_L2NORM)
        b_v = tl.load(v + row * stride_vb + i_hv * V + o_v, mask=m_v, other=0.0).to(tl.float32)
        b_g, b_beta = _load_gates(a, b, A_log, dt_bias, row, i_hv, stride_ab, stride_bb)
        b_h = _delta_rule_token(b_h, b_k, b_v, b_g, b_beta)
    tl.store(p_state, b_h, mask=m_vk)


def _check_layout(op: str, state_slots: torch.Tensor, verify_rows: torch.Tensor) -> None:
    check_dtype(op, "state_slots", state_slots, (torch.int64, torch.int32))
    check_contiguous(op, "state_slots", state_slots)
    check_dtype(op, "verify_rows", verify_rows, (torch.int64, torch.int32))
    if verify_rows.ndim != 2 or verify_rows.shape[0] != state_slots.shape[0]:
        raise ValueError(
            f"{op}: verify_rows has shape {list(verify_rows.shape)} for {state_slots.shape[0]} "
            "state slots; expected [B, T], one row of positions per sequence"
        )
    check_contiguous(op, "verify_rows", verify_rows)


def _check_rows(op: str, q_or_k, k, v, a, b, A_log, dt_bias, state) -> None:
    check_qkv(op, q_or_k, k, v, rows="N")
    check_state_pool(op, state, v, k.shape[2])
    check_gate_inputs(op, a, b, A_log, dt_bias)
    check_shape(op, "a", a, tuple(v.shape[:2]))


def _tiles(head_k: int, head_v: int) -> tuple[int, int]:
    """(BK, BV): the decode kernel's tile with the early state read, as the model decodes."""
    return triton.next_power_of_2(head_k), min(triton.next_power_of_2(head_v), EARLY_STATE_V_TILE)


def fused_recurrent_gated_delta_rule_verify(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    a: torch.Tensor,
    b: torch.Tensor,
    A_log: torch.Tensor,
    dt_bias: torch.Tensor,
    state: torch.Tensor,
    *,
    state_slots: torch.Tensor,
    verify_rows: torch.Tensor,
    scale: float | None = None,
    use_qk_l2norm: bool = True,
    norm_gate: torch.Tensor | None = None,
    norm_weight: torch.Tensor | None = None,
    norm_eps: float = 1e-6,
) -> torch.Tensor:
    """Each sequence's positions as consecutive decode tokens from its slot's state, which is
    left untouched.

    Args:
        q: [N, H, K] queries of every verified row (rows may be strided, heads dense).
        k: [N, H, K] keys.
        v: [N, HV, V] values; value head j reads key head j // (HV // H).
        a: [N, HV] raw decay projection; g = -exp(A_log) * softplus(a + dt_bias) in fp32.
        b: [N, HV] raw write-strength projection; beta = sigmoid(b).
        A_log: [HV] log decay rate.
        dt_bias: [HV] decay bias.
        state: [num_slots, HV, V, K] fp32 contiguous state pool (each head's S stored
            transposed); read only.
        state_slots: [B] int64 slot per sequence; -1 is a padding sequence (its rows zero).
        verify_rows: [B, T] int64 row of position t of sequence i, -1 past its last position;
            every row of N belongs to one (i, t).
        scale: query scale; defaults to K ** -0.5.
        use_qk_l2norm: l2-normalise q and k (fp32, eps 1e-6) inside the kernel.
        norm_gate: optional [N, HV, V] gate z: the output is then `gated_rms_norm(o,
            norm_gate, norm_weight, norm_eps)` of the plain output o, launched after.
        norm_weight: [V] the gated norm's weight; given together with norm_gate.
        norm_eps: the gated norm's variance epsilon.

    Returns:
        o: [N, HV, V] in v.dtype.
    """
    op = "fused_recurrent_gated_delta_rule_verify"
    _check_rows(op, q, k, v, a, b, A_log, dt_bias, state)
    _check_layout(op, state_slots, verify_rows)
    tensors = {"q": q, "k": k, "v": v, "a": a, "b": b, "state": state}
    check_device(op, tensors | {"state_slots": state_slots, "verify_rows": verify_rows})
    if norm_gate is not None or norm_weight is not None:
        _check_norm(op, v, norm_gate, norm_weight)
    num_rows, num_heads, head_k = q.shape
    num_v_heads, head_v = v.shape[1:]
    scale = head_k**-0.5 if scale is None else scale
    o = torch.empty(num_rows, num_v_heads, head_v, dtype=v.dtype, device=v.device)
    num_seqs = state_slots.shape[0]
    if num_rows and num_seqs:
        BK, BV = _tiles(head_k, head_v)
        _recurrent_verify_kernel[(triton.cdiv(head_v, BV), num_seqs * num_v_heads)](
            q, k, v, a, b, A_log, dt_bias, state, state_slots, verify_rows, o,
            verify_rows.shape[1],
            q.stride(0), k.stride(0), v.stride(0), a.stride(0), b.stride(0), scale,
            H=num_heads, HV=num_v_heads, K=head_k, V=head_v, BK=BK, BV=BV,
            USE_QK_L2NORM=use_qk_l2norm, num_warps=NUM_WARPS,
        )  # fmt: skip
    if norm_gate is not None and norm_weight is not None:
        return gated_rms_norm(o, norm_gate, norm_weight, norm_eps)
    return o


def fused_recurrent_gated_delta_rule_commit(
    k: torch.Tensor,
    v: torch.Tensor,
    a: torch.Tensor,
    b: torch.Tensor,
    A_log: torch.Tensor,
    dt_bias: torch.Tensor,
    state: torch.Tensor,
    *,
    state_slots: torch.Tensor,
    verify_rows: torch.Tensor,
    num_kept: torch.Tensor,
    use_qk_l2norm: bool = True,
) -> None:
    """Apply each sequence's first num_kept positions of a verify to the state in its slot.

    Args:
        k: [N, H, K] the verify's keys (post-conv), by verify row.
        v: [N, HV, V] its values.
        a: [N, HV] its raw decay projection.
        b: [N, HV] its raw write-strength projection.
        A_log: [HV] log decay rate.
        dt_bias: [HV] decay bias.
        state: [num_slots, HV, V, K] fp32 contiguous state pool; row state_slots[i] advanced in
            place by num_kept[i] tokens.
        state_slots: [B] int64 slot per sequence; -1 is a padding sequence (skipped).
        verify_rows: [B, T] int64 row of position t of sequence i (as given to the verify).
        num_kept: [B] int64 positions to apply, 0 to T (0: the state stays).
        use_qk_l2norm: l2-normalise k (fp32, eps 1e-6), as the verify did.
    """
    op = "fused_recurrent_gated_delta_rule_commit"
    _check_rows(op, k, k, v, a, b, A_log, dt_bias, state)
    _check_layout(op, state_slots, verify_rows)
    check_dtype(op, "num_kept", num_kept, (torch.int64, torch.int32))
    check_shape(op, "num_kept", num_kept, tuple(state_slots.shape))
    check_contiguous(op, "num_kept", num_kept)
    tensors = {"k": k, "v": v, "a": a, "b": b, "state": state, "num_kept": num_kept}
    check_device(op, tensors | {"state_slots": state_slots, "verify_rows": verify_rows})
    num_seqs = state_slots.shape[0]
    num_heads, head_k = k.shape[1:]
    num_v_heads, head_v = v.shape[1:]
    if num_seqs == 0 or k.shape[0] == 0:
        return
    BK, BV = _tiles(head_k, head_v)
    _recurrent_commit_kernel[(triton.cdiv(head_v, BV), num_seqs * num_v_heads)](
        k, v, a, b, A_log, dt_bias, state, state_slots, verify_rows, num_kept,
        verify_rows.shape[1], k.stride(0), v.stride(0), a.stride(0), b.stride(0),
        H=num_heads, HV=num_v_heads, K=head_k, V=head_v, BK=BK, BV=BV,
        USE_QK_L2NORM=use_qk_l2norm, num_warps=NUM_WARPS,
    )  # fmt: skip
