"""Recurrent gated-delta-rule decode: one token per sequence, state updated in place in its slot.

One program per (V block, sequence x value head) reads its [BV, K] tile of the fp32 state once and
writes it once (the pool stores each head's S transposed, [V, K], so the tile is one contiguous
block); the l2norm of q and k, the gates and beta are fused in. Given the gated RMSNorm
that follows in the model (its gate and weight), batches of up to NORM_IN_KERNEL_MAX_SEQS
sequences run one program per value head's whole V that normalises its output before the store,
which saves the norm's launch; larger batches launch the norm after, where whole heads per program
ran slower on the H200 (the GDN kernel record in docs/benchmarks.md times both at 1-32
sequences). Inside `batch_invariant` every batch size takes V tiles and the norm after.

With `early_state` a program reads its state tile before it waits on the kernel before it
(dependent launch): the read overlaps that kernel's tail. In the 27B decode step on an H200 this,
with the conv update's `early_state`, ran the engine 0.3-1.0% faster at 1-32 streams
(docs/benchmarks.md).

The kernel also serves the speculative verify and its commit (verify.py): a program runs a
sequence's positions in a runtime loop (decode: one), storing each output and/or the final state
by runtime switches. Decode, verify and commit thus run one compiled kernel, so at the same
tile and switches (`early_state`, the norm after, as inside `batch_invariant`) a verify row
and a commit's state have the bits of decode steps by construction, not by what the compiler
happens to emit for a loop and for straight-line code.
"""

# Triton's annotations misread valid kernel code: num_warps/num_stages, constexpr branches.
# pyright: reportCallIssue=false
# pyright: reportPossiblyUnboundVariable=false

import torch
import triton
import triton.language as tl
from sparkinfer.kernels._triton import (
    check_contiguous,
    check_device,
    check_dtype,
    check_shape,
)
from sparkinfer.kernels.dependent_launch import dependent_launch, wait_for_prior_kernels
from sparkinfer.kernels.gated_delta_rule.checks import check_qkv, check_state_pool
from sparkinfer.kernels.gated_delta_rule.gating import _gates, check_gate_inputs
from sparkinfer.kernels.linear.invariant import current_phase
from sparkinfer.kernels.rms_norm.fused import (
    gated_norm_rows,
    gated_rms_norm,
    rounds_weight_product,
)

# The V tile and warps of a program that holds a [V_TILE, K] block of a head, the gated norm
# launched after; tuned on an H200 (HV=48, K=V=128, docs/benchmarks.md). With the early state
# read, as the model decodes, 16 rows on one warp led at 8-64 sequences (0.85 of the copy rate at
# 32 over 48 layers' states, `--tune-decode`): small programs start their reads while the kernel
# ahead still runs. A launch on its own ran slower on 16 rows (0.74-0.76 at 32 in the kernel
# records) and takes 32 rows on one warp (0.80 there).
V_TILE, EARLY_STATE_V_TILE = 32, 16
NUM_WARPS = 1
NORM_IN_KERNEL_MAX_SEQS = 4  # the gated norm runs in the kernel up to this many sequences
# Warps of the program that holds a whole [V, K] head and the norm, by sequences (1, 2, 3, 4;
# the last entry beyond).
NORM_NUM_WARPS = (8, 8, 4, 4)


@triton.jit
def _load_key(p, m_k, USE_QK_L2NORM: tl.constexpr):
    """One head's query or key row in fp32, l2-normalised (eps 1e-6) when asked."""
    b_x = tl.load(p, mask=m_k, other=0.0).to(tl.float32)
    if USE_QK_L2NORM:
        b_x = b_x * tl.rsqrt(tl.sum(b_x * b_x) + 1e-6)
    return b_x


@triton.jit
def _load_gates(a, b, A_log, dt_bias, i_row, i_hv, stride_ab, stride_bb):
    """(g, beta) of value head i_hv at row i_row, fp32."""
    return _gates(
        tl.load(a + i_row * stride_ab + i_hv).to(tl.float32),
        tl.load(b + i_row * stride_bb + i_hv).to(tl.float32),
        tl.load(A_log + i_hv).to(tl.float32),
        tl.load(dt_bias + i_hv).to(tl.float32),
    )


@triton.jit
def _delta_rule_token(b_h, b_k, b_v, b_g, b_beta):
    """One token's update of a [BV, BK] tile of S^T: decay, read the memory, write the delta (the
    order of the reference). Every kernel that advances a state (decode, the verify's positions,
    the commit's replay) runs this, so their states agree bit for bit."""
    b_h *= tl.exp(b_g)
    b_delta = (b_v - tl.sum(b_h * b_k[None, :], 1)) * b_beta
    b_h += b_delta[:, None] * b_k[None, :]
    return b_h


# The index arguments and the runtime counts and switches stay unspecialized: decode, verify and
# commit then run one build of this kernel (at equal constexprs), the same machine code for every
# position's arithmetic.
_RUNTIME_ARGS = ["state_slots", "seq_rows", "num_kept", "T", "rows_given", "kept_given",
                 "store_output", "store_state"]  # fmt: skip


@triton.jit(do_not_specialize=_RUNTIME_ARGS)
def _fused_recurrent_kernel(
    q, k, v, a, b, A_log, dt_bias, state, state_slots, seq_rows, num_kept, o, norm_gate,
    norm_weight, T, rows_given, kept_given, store_output, store_state,
    stride_qb, stride_kb, stride_vb, stride_ab, stride_bb, stride_gb, scale, norm_eps,
    H: tl.constexpr, HV: tl.constexpr, K: tl.constexpr, V: tl.constexpr,
    BK: tl.constexpr, BV: tl.constexpr, USE_QK_L2NORM: tl.constexpr, USE_PDL: tl.constexpr,
    GATED_NORM: tl.constexpr, ROUND_PRODUCT: tl.constexpr, EARLY_STATE: tl.constexpr,
):  # fmt: skip
    """Sequence i_n's positions one after the other from its slot's state, in registers.

    Its positions: T of them at rows seq_rows[i_n, :] (rows_given; -1 skips a position), else
    one at row i_n; with kept_given only the first num_kept[i_n]. store_output writes each
    position's output at its row, store_state the state after the last one back to the slot.
    Decode: one position at its own row, both stored; verify: T positions, outputs only;
    commit: num_kept positions, the state only."""
    i_v, i_nh = tl.program_id(0).to(tl.int64), tl.program_id(1).to(tl.int64)
    i_n, i_hv = i_nh // HV, i_nh % HV
    i_h = i_hv // (HV // H)
    o_k = tl.arange(0, BK)
    o_v = i_v * BV + tl.arange(0, BV)
    m_k, m_v = o_k < K, o_v < V
    m_vk = m_v[:, None] & m_k[None, :]
    o_vk = o_v[:, None] * K + o_k[None, :]  # the pool holds S transposed: this tile is contiguous
    if EARLY_STATE:  # the caller vouches the kernel before writes neither slots nor states
        slot = tl.load(state_slots + i_n).to(tl.int64)
        # [BV, BK] fp32 (S^T); a padding row (slot -1) reads slot 0 and never uses it
        b_h = tl.load(state + (tl.maximum(slot, 0) * HV + i_hv) * K * V + o_vk, mask=m_vk,
                      other=0.0)  # fmt: skip
    wait_for_prior_kernels(USE_PDL)
    if not EARLY_STATE:
        slot = tl.load(state_slots + i_n).to(tl.int64)
    n = T
    if kept_given:
        n = tl.load(num_kept + i_n).to(tl.int32)
    p_rows = seq_rows + i_n * T
    if slot < 0:  # a padding sequence: zero output at each of its rows
        if store_output:
            for t in range(0, n):
                row = i_n
                if rows_given:
                    row = tl.load(p_rows + t).to(tl.int64)
                if row >= 0:
                    p_o = o + (row * HV + i_hv) * V + o_v
                    tl.store(p_o, tl.zeros([BV], dtype=tl.float32).to(o.dtype.element_ty),
                             mask=m_v)  # fmt: skip
        return
    p_state = state + (slot * HV + i_hv) * K * V + o_vk
    if not EARLY_STATE:
        b_h = tl.load(p_state, mask=m_vk, other=0.0)  # [BV, BK] fp32 (S^T)
    for t in range(0, n):
        row = i_n
        if rows_given:
            row = tl.load(p_rows + t).to(tl.int64)
        if row >= 0:
            b_k = _load_key(k + row * stride_kb + i_h * K + o_k, m_k, USE_QK_L2NORM)
            p_v = v + row * stride_vb + i_hv * V + o_v
            b_v = tl.load(p_v, mask=m_v, other=0.0).to(tl.float32)
            b_g, b_beta = _load_gates(a, b, A_log, dt_bias, row, i_hv, stride_ab, stride_bb)
            b_h = _delta_rule_token(b_h, b_k, b_v, b_g, b_beta)
            if store_output:
                p_q = q + row * stride_qb + i_h * K + o_k
                b_q = _load_key(p_q, m_k, USE_QK_L2NORM) * scale
                b_o = tl.sum(b_h * b_q[None, :], 1)  # read out after the write, as the ref does
                if GATED_NORM:  # BV == V: the whole head, normed from its output rounded as stored
                    p_z = norm_gate + row * stride_gb + i_hv * V + o_v
                    b_z = tl.load(p_z, mask=m_v, other=0.0)
                    b_w = tl.load(norm_weight + o_v, mask=m_v, other=0.0).to(tl.float32)
                    b_o = b_o.to(o.dtype.element_ty).to(tl.float32)
                    b_o = gated_norm_rows(b_o, b_z.to(tl.float32), b_w, V, norm_eps,
                                          o.dtype.element_ty, ROUND_PRODUCT)  # fmt: skip
                tl.store(o + (row * HV + i_hv) * V + o_v, b_o.to(o.dtype.element_ty), mask=m_v)
    if store_state:
        tl.store(p_state, b_h, mask=m_vk)


def decode_tiling(head_v: int, *, early_state: bool, num_seqs_in_kernel_norm: int = 0):
    """(BV, num_warps) of `_fused_recurrent_kernel`: V tiles (EARLY_STATE_V_TILE rows with the
    early state read, else V_TILE) on NUM_WARPS, or, for the gated norm in the kernel over that
    many sequences (> 0), whole heads on NORM_NUM_WARPS. Decode, verify and commit all take
    their tile here."""
    if num_seqs_in_kernel_norm > 0:
        num_warps = NORM_NUM_WARPS[min(num_seqs_in_kernel_norm, len(NORM_NUM_WARPS)) - 1]
        return triton.next_power_of_2(head_v), num_warps
    tile = EARLY_STATE_V_TILE if early_state else V_TILE
    return min(triton.next_power_of_2(head_v), tile), NUM_WARPS


def launch_recurrent(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    a: torch.Tensor,
    b: torch.Tensor,
    A_log: torch.Tensor,
    dt_bias: torch.Tensor,
    state: torch.Tensor,
    state_slots: torch.Tensor,
    o: torch.Tensor,
    *,
    seq_rows: torch.Tensor | None,
    num_kept: torch.Tensor | None,
    store_output: bool,
    store_state: bool,
    scale: float,
    use_qk_l2norm: bool,
    early_state: bool,
    norm: tuple[torch.Tensor, torch.Tensor, float] | None = None,
) -> None:
    """One launch of `_fused_recurrent_kernel` over state_slots' sequences: their positions at
    seq_rows ([B, T]; None: one at row i), the first num_kept[i] of them (None: all), outputs
    into o and/or the state into the slots. norm (gate, weight, eps): the gated norm inside, on
    whole heads. Every constexpr but the norm's is set here from the arguments alike for decode,
    verify and commit, so they run one build."""
    num_seqs = state_slots.shape[0]
    num_heads, head_k = k.shape[1:]
    num_v_heads, head_v = v.shape[1:]
    BV, num_warps = decode_tiling(
        head_v, early_state=early_state, num_seqs_in_kernel_norm=num_seqs if norm else 0
    )
    gate, weight, eps = norm if norm is not None else (o, o, 0.0)  # read only with the norm
    pdl = dependent_launch(k)
    _fused_recurrent_kernel[(triton.cdiv(head_v, BV), num_seqs * num_v_heads)](
        q, k, v, a, b, A_log, dt_bias, state, state_slots,
        state_slots if seq_rows is None else seq_rows,
        state_slots if num_kept is None else num_kept,
        o, gate, weight,
        1 if seq_rows is None else seq_rows.shape[1], int(seq_rows is not None),
        int(num_kept is not None), int(store_output), int(store_state),
        q.stride(0), k.stride(0), v.stride(0), a.stride(0), b.stride(0), gate.stride(0),
        scale, eps,
        H=num_heads, HV=num_v_heads, K=head_k, V=head_v, BK=triton.next_power_of_2(head_k),
        BV=BV, USE_QK_L2NORM=use_qk_l2norm, USE_PDL=pdl, GATED_NORM=norm is not None,
        ROUND_PRODUCT=norm is not None and rounds_weight_product(weight, v),
        EARLY_STATE=early_state,
        num_warps=num_warps, launch_pdl=pdl,
    )  # fmt: skip


def _check_inputs(q, k, v, state, state_slots) -> None:
    op = "fused_recurrent_gated_delta_rule"
    check_qkv(op, q, k, v, rows="B")
    check_state_pool(op, state, v, q.shape[2])
    check_dtype(op, "state_slots", state_slots, (torch.int64, torch.int32))
    check_shape(op, "state_slots", state_slots, (q.shape[0],))
    check_contiguous(op, "state_slots", state_slots)


def fused_recurrent_gated_delta_rule(
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
    scale: float | None = None,
    use_qk_l2norm: bool = True,
    norm_gate: torch.Tensor | None = None,
    norm_weight: torch.Tensor | None = None,
    norm_eps: float = 1e-6,
    early_state: bool = False,
) -> torch.Tensor:
    """One decode token per sequence: gates, l2norm and the delta-rule step, state updated in place.

    Args:
        q: [B, H, K] queries (bf16, fp16 or fp32; rows may be strided, heads dense).
        k: [B, H, K] keys.
        v: [B, HV, V] values; value head j reads key head j // (HV // H).
        a: [B, HV] raw decay projection; g = -exp(A_log) * softplus(a + dt_bias) in fp32.
        b: [B, HV] raw write-strength projection; beta = sigmoid(b).
        A_log: [HV] log decay rate.
        dt_bias: [HV] decay bias.
        state: [num_slots, HV, V, K] fp32 contiguous state pool (each head's S stored transposed),
            row ``state_slots[i]`` updated.
        state_slots: [B] int64 slot per sequence; -1 is a padding row (skipped, output zero).
        scale: query scale; defaults to K ** -0.5.
        use_qk_l2norm: l2-normalise q and k (fp32, eps 1e-6) inside the kernel.
        norm_gate: optional [B, HV, V] gate z (v's dtype; rows may be strided, heads dense):
            the output is then the gated RMSNorm `gated_rms_norm(o, norm_gate, norm_weight,
            norm_eps)` of the plain output o (in this launch up to NORM_IN_KERNEL_MAX_SEQS rows).
        norm_weight: [V] the gated norm's weight; given together with norm_gate.
        norm_eps: the gated norm's variance epsilon.
        early_state: read the slots and states before waiting on the kernel launched just
            before this one (dependent launch), so the reads overlap its tail. Pass True only
            when that kernel writes neither (the model's causal conv update, for one). V tiles
            are then EARLY_STATE_V_TILE rows; the bits are the same either way.

    Returns:
        o: [B, HV, V] in v.dtype.
    """
    op = "fused_recurrent_gated_delta_rule"
    _check_inputs(q, k, v, state, state_slots)
    check_gate_inputs(op, a, b, A_log, dt_bias)
    check_shape(op, "a", a, tuple(v.shape[:2]))
    tensors = {"q": q, "k": k, "v": v, "a": a, "b": b, "A_log": A_log, "dt_bias": dt_bias}
    check_device(op, tensors | {"state": state, "state_slots": state_slots})
    if norm_gate is not None or norm_weight is not None:
        _check_norm(op, v, norm_gate, norm_weight)
    num_seqs, _, head_k = q.shape
    num_v_heads, head_v = v.shape[1:]
    q_scale = head_k**-0.5 if scale is None else scale
    # Inside batch_invariant one tiling serves every batch size, so a row's bits never depend
    # on how many others share the step: V tiles, the norm launched after.
    is_invariant = current_phase() is not None
    o = torch.empty(num_seqs, num_v_heads, head_v, dtype=v.dtype, device=v.device)
    if num_seqs == 0:
        return o
    norm = None if norm_gate is None or norm_weight is None else (norm_gate, norm_weight, norm_eps)
    in_kernel = norm is not None and not is_invariant and num_seqs <= NORM_IN_KERNEL_MAX_SEQS
    launch_recurrent(
        q, k, v, a, b, A_log, dt_bias, state, state_slots, o,
        seq_rows=None, num_kept=None, store_output=True, store_state=True, scale=q_scale,
        use_qk_l2norm=use_qk_l2norm, early_state=early_state, norm=norm if in_kernel else None,
    )  # fmt: skip
    if norm is not None and not in_kernel:
        return gated_rms_norm(o, *norm)
    return o


def _check_norm(
    op: str, v: torch.Tensor, norm_gate: torch.Tensor | None, norm_weight: torch.Tensor | None
) -> None:
    if norm_gate is None or norm_weight is None:
        raise ValueError(f"{op}: give norm_gate and norm_weight together, or neither")
    check_dtype(op, "norm_gate", norm_gate, (v.dtype,))
    check_shape(op, "norm_gate", norm_gate, tuple(v.shape))
    if norm_gate.shape[0] and (norm_gate.stride(2) != 1 or norm_gate.stride(1) != v.shape[2]):
        raise ValueError(
            f"{op}: norm_gate needs dense heads (strides (*, {v.shape[2]}, 1)), got "
            f"{norm_gate.stride()}: pass a view whose heads are contiguous"
        )
    check_dtype(op, "norm_weight", norm_weight, (v.dtype, torch.float32))
    check_shape(op, "norm_weight", norm_weight, (v.shape[2],))
    check_contiguous(op, "norm_weight", norm_weight)
    check_device(op, {"v": v, "norm_gate": norm_gate, "norm_weight": norm_weight})
