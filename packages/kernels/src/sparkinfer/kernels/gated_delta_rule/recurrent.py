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


@triton.jit
def _fused_recurrent_kernel(
    q, k, v, a, b, A_log, dt_bias, state, state_slots, o, norm_gate, norm_weight,
    stride_qb, stride_kb, stride_vb, stride_ab, stride_bb, stride_gb, scale, norm_eps,
    H: tl.constexpr, HV: tl.constexpr, K: tl.constexpr, V: tl.constexpr,
    BK: tl.constexpr, BV: tl.constexpr, USE_QK_L2NORM: tl.constexpr, USE_PDL: tl.constexpr,
    GATED_NORM: tl.constexpr, ROUND_PRODUCT: tl.constexpr, EARLY_STATE: tl.constexpr,
):  # fmt: skip
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
    p_o = o + (i_n * HV + i_hv) * V + o_v
    if not EARLY_STATE:
        slot = tl.load(state_slots + i_n).to(tl.int64)
    if slot < 0:
        tl.store(p_o, tl.zeros([BV], dtype=tl.float32).to(o.dtype.element_ty), mask=m_v)
        return
    p_state = state + (slot * HV + i_hv) * K * V + o_vk
    if not EARLY_STATE:
        b_h = tl.load(p_state, mask=m_vk, other=0.0)  # [BV, BK] fp32 (S^T)
    b_q = _load_key(q + i_n * stride_qb + i_h * K + o_k, m_k, USE_QK_L2NORM) * scale
    b_k = _load_key(k + i_n * stride_kb + i_h * K + o_k, m_k, USE_QK_L2NORM)
    b_v = tl.load(v + i_n * stride_vb + i_hv * V + o_v, mask=m_v, other=0.0).to(tl.float32)
    b_g, b_beta = _load_gates(a, b, A_log, dt_bias, i_n, i_hv, stride_ab, stride_bb)
    b_h = _delta_rule_token(b_h, b_k, b_v, b_g, b_beta)
    b_o = tl.sum(b_h * b_q[None, :], 1)  # read out after the write, as the reference does
    tl.store(p_state, b_h, mask=m_vk)
    if GATED_NORM:  # BV == V: the whole head, normed from its output rounded as stored
        b_z = tl.load(norm_gate + i_n * stride_gb + i_hv * V + o_v, mask=m_v, other=0.0)
        b_w = tl.load(norm_weight + o_v, mask=m_v, other=0.0).to(tl.float32)
        b_o = b_o.to(o.dtype.element_ty).to(tl.float32)
        b_o = gated_norm_rows(b_o, b_z.to(tl.float32), b_w, V, norm_eps, o.dtype.element_ty,
                              ROUND_PRODUCT)  # fmt: skip
    tl.store(p_o, b_o.to(o.dtype.element_ty), mask=m_v)


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
    num_seqs, num_heads, head_k = q.shape
    num_v_heads, head_v = v.shape[1:]
    scale = head_k**-0.5 if scale is None else scale
    # Inside batch_invariant one tiling serves every batch size, so a row's bits never depend
    # on how many others share the step: V tiles, the norm launched after.
    is_invariant = current_phase() is not None
    o = torch.empty(num_seqs, num_v_heads, head_v, dtype=v.dtype, device=v.device)
    if num_seqs == 0:
        return o
    BK = triton.next_power_of_2(head_k)
    BV = min(triton.next_power_of_2(head_v), EARLY_STATE_V_TILE if early_state else V_TILE)
    num_warps = NUM_WARPS
    gate, weight, in_kernel = o, o, False  # placeholders the kernel reads only with the norm
    if norm_gate is not None and norm_weight is not None:
        in_kernel = not is_invariant and num_seqs <= NORM_IN_KERNEL_MAX_SEQS
        gate, weight = norm_gate, norm_weight
    if in_kernel:  # whole heads: the norm reduces over V
        BV = triton.next_power_of_2(head_v)
        num_warps = NORM_NUM_WARPS[min(num_seqs, len(NORM_NUM_WARPS)) - 1]
    pdl = dependent_launch(q)
    _fused_recurrent_kernel[(triton.cdiv(head_v, BV), num_seqs * num_v_heads)](
        q, k, v, a, b, A_log, dt_bias, state, state_slots, o, gate, weight,
        q.stride(0), k.stride(0), v.stride(0), a.stride(0), b.stride(0), gate.stride(0),
        scale, norm_eps,
        H=num_heads, HV=num_v_heads, K=head_k, V=head_v, BK=BK, BV=BV,
        USE_QK_L2NORM=use_qk_l2norm, USE_PDL=pdl, GATED_NORM=in_kernel,
        ROUND_PRODUCT=in_kernel and rounds_weight_product(weight, v),
        EARLY_STATE=early_state,
        num_warps=num_warps, launch_pdl=pdl,
    )  # fmt: skip
    if norm_gate is not None and norm_weight is not None and not in_kernel:
        return gated_rms_norm(o, norm_gate, norm_weight, norm_eps)
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
