"""A Gated-DeltaNet layer's decode step in one launch: causal conv + SiLU, gates, l2norm, the
delta-rule step and the gated RMSNorm, for one token per sequence.

One program per (V block, sequence x value head) convolves the channels it reads (its key head's
q and k, its own BV value channels) from the slot's conv window, then updates its [K, BV] tile
of the fp32 state as `fused_recurrent_gated_delta_rule` does. Two kinds of state are shared
between programs, and arrival counters (`sparkinfer.kernels.arrival`) settle both without a
second launch:

- a key head's q and k windows are read by every program of its value heads; the last of them
  to arrive stores their shifted windows, once no program reads the old ones;
- the gated norm reduces over a head's whole V: each V block stores its output rounded as the
  plain op stores it, and the head's last block to arrive norms the stored row in place.

The arithmetic is the separate launches' (the conv update kernel's helper, the recurrent kernel's
step, the norm's helper), so the outputs and states match them. Inside `batch_invariant` this op
runs those launches (a row's bits then never depend on the batch).
"""

# Triton's annotations misread valid kernel code: constexpr arguments, num_warps.
# pyright: reportArgumentType=false, reportCallIssue=false

import torch
import triton
import triton.language as tl
from sparkinfer.kernels._triton import (
    check_contiguous,
    check_device,
    check_dtype,
    check_shape,
)
from sparkinfer.kernels.arrival import MAX_COUNTERS, arrival_counters
from sparkinfer.kernels.causal_conv1d.fused import (
    causal_conv1d_update,
    check_conv_inputs,
    conv_update_channels,
    store_window,
)
from sparkinfer.kernels.dependent_launch import dependent_launch, wait_for_prior_kernels
from sparkinfer.kernels.gated_delta_rule.checks import check_state_pool
from sparkinfer.kernels.gated_delta_rule.gating import _gates, check_gate_inputs
from sparkinfer.kernels.gated_delta_rule.recurrent import fused_recurrent_gated_delta_rule
from sparkinfer.kernels.linear.invariant import current_phase
from sparkinfer.kernels.rms_norm.fused import gated_norm_rows, rounds_weight_product

# V tile below / from LARGE_BATCH sequences (HV=48, K=V=128 on an H200).
BV_SMALL_BATCH, BV_LARGE_BATCH, LARGE_BATCH = 32, 64, 8
NUM_WARPS = 4


@triton.jit
def _conv_recurrent_kernel(
    x, conv_weight, conv_state, a, b, A_log, dt_bias, state, state_slots, o, norm_gate,
    norm_weight, arrived, norm_counters,
    stride_xb, stride_wc, stride_ab, stride_bb, stride_gb, scale, norm_eps,
    H: tl.constexpr, HV: tl.constexpr, K: tl.constexpr, V: tl.constexpr, W: tl.constexpr,
    BK: tl.constexpr, BV: tl.constexpr, BVH: tl.constexpr, BR: tl.constexpr,
    USE_QK_L2NORM: tl.constexpr, USE_PDL: tl.constexpr, GATED_NORM: tl.constexpr,
    ROUND_PRODUCT: tl.constexpr,
):  # fmt: skip
    wait_for_prior_kernels(USE_PDL)
    i_v, i_nh = tl.program_id(0).to(tl.int64), tl.program_id(1).to(tl.int64)
    i_n, i_hv = i_nh // HV, i_nh % HV
    i_h = i_hv // (HV // H)
    C: tl.constexpr = 2 * H * K + HV * V
    o_k = tl.arange(0, BK)
    o_v = i_v * BV + tl.arange(0, BV)
    m_k, m_v = o_k < K, o_v < V
    p_o = o + (i_n * HV + i_hv) * V + o_v
    slot = tl.load(state_slots + i_n).to(tl.int64)
    if slot < 0:
        tl.store(p_o, tl.zeros([BV], dtype=tl.float32).to(o.dtype.element_ty), mask=m_v)
        return
    p_state = state + (slot * HV + i_hv) * K * V + o_k[:, None] * V + o_v[None, :]
    m_kv = m_k[:, None] & m_v[None, :]
    b_h = tl.load(p_state, mask=m_kv, other=0.0)  # [BK, BV] fp32
    # The conv: q and k of key head i_h, this program's value channels.
    x_row = x + i_n * stride_xb
    p_window = conv_state + slot * (W - 1) * C
    c_q, c_k, c_v = i_h * K + o_k, H * K + i_h * K + o_k, 2 * H * K + i_hv * V + o_v
    b_q, win_q = conv_update_channels(x_row, conv_weight, p_window, c_q, m_k, C, stride_wc, W, BR)
    b_k, win_k = conv_update_channels(x_row, conv_weight, p_window, c_k, m_k, C, stride_wc, W, BR)
    b_v, win_v = conv_update_channels(x_row, conv_weight, p_window, c_v, m_v, C, stride_wc, W, BR)
    tl.debug_barrier()  # every read of the old windows precedes the writes and the arrival
    store_window(p_window, win_v, c_v, m_v, C, W, BR)  # this program's channels alone
    p_qk_arrived = arrived + i_n * H + i_h
    if tl.atomic_add(p_qk_arrived, 1, sem="acq_rel") == (HV // H) * tl.num_programs(0) - 1:
        # Every program of key head i_h has read its q and k windows.
        store_window(p_window, win_q, c_q, m_k, C, W, BR)
        store_window(p_window, win_k, c_k, m_k, C, W, BR)
        tl.store(p_qk_arrived, 0)
    if USE_QK_L2NORM:
        b_q = b_q * tl.rsqrt(tl.sum(b_q * b_q) + 1e-6)
        b_k = b_k * tl.rsqrt(tl.sum(b_k * b_k) + 1e-6)
    b_q = b_q * scale
    b_g, b_beta = _gates(
        tl.load(a + i_n * stride_ab + i_hv).to(tl.float32),
        tl.load(b + i_n * stride_bb + i_hv).to(tl.float32),
        tl.load(A_log + i_hv).to(tl.float32),
        tl.load(dt_bias + i_hv).to(tl.float32),
    )
    # Decay, read the memory, write the delta, read out: the order of the reference.
    b_h *= tl.exp(b_g)
    b_delta = (b_v - tl.sum(b_h * b_k[:, None], 0)) * b_beta
    b_h += b_k[:, None] * b_delta[None, :]
    b_o = tl.sum(b_h * b_q[:, None], 0)
    tl.store(p_state, b_h, mask=m_kv)
    if not GATED_NORM:
        tl.store(p_o, b_o.to(o.dtype.element_ty), mask=m_v)
    elif BV == BVH:  # the whole head here: norm it from its output rounded as stored
        b_z = tl.load(norm_gate + i_n * stride_gb + i_hv * V + o_v, mask=m_v, other=0.0)
        b_w = tl.load(norm_weight + o_v, mask=m_v, other=0.0).to(tl.float32)
        b_o = b_o.to(o.dtype.element_ty).to(tl.float32)
        b_o = gated_norm_rows(b_o, b_z.to(tl.float32), b_w, V, norm_eps, o.dtype.element_ty,
                              ROUND_PRODUCT)  # fmt: skip
        tl.store(p_o, b_o.to(o.dtype.element_ty), mask=m_v)
    else:
        tl.store(p_o, b_o.to(o.dtype.element_ty), mask=m_v)
        tl.debug_barrier()  # every thread's store precedes the release below
        p_head_arrived = norm_counters + i_n * HV + i_hv
        if tl.atomic_add(p_head_arrived, 1, sem="acq_rel") == tl.num_programs(0) - 1:
            # The head's last V block norms the stored row, whichever block it is.
            o_h = tl.arange(0, BVH)
            m_h = o_h < V
            p_row = o + (i_n * HV + i_hv) * V + o_h
            b_row = tl.load(p_row, mask=m_h, other=0.0, cache_modifier=".cg").to(tl.float32)
            b_z = tl.load(norm_gate + i_n * stride_gb + i_hv * V + o_h, mask=m_h, other=0.0)
            b_w = tl.load(norm_weight + o_h, mask=m_h, other=0.0).to(tl.float32)
            b_row = gated_norm_rows(b_row, b_z.to(tl.float32), b_w, V, norm_eps,
                                    o.dtype.element_ty, ROUND_PRODUCT)  # fmt: skip
            tl.store(p_row, b_row.to(o.dtype.element_ty), mask=m_h)
            tl.store(p_head_arrived, 0)


def _check_inputs(op, x, conv_weight, conv_state, state, state_slots, num_heads) -> None:
    check_conv_inputs(op, x, conv_weight, conv_state)
    check_dtype(op, "state", state, (torch.float32,))
    if state.dim() != 4:
        raise ValueError(
            f"{op}: state has shape {list(state.shape)}; expected [num_slots, HV, K, V]"
        )
    num_v_heads, head_k, head_v = state.shape[1:]
    if num_heads < 1 or num_v_heads % num_heads:
        raise ValueError(
            f"{op}: num_heads={num_heads} for {num_v_heads} value heads; expected a divisor"
        )
    channels = 2 * num_heads * head_k + num_v_heads * head_v
    if x.shape[1] != channels:
        raise ValueError(
            f"{op}: x has {x.shape[1]} channels; expected [q | k | v] = 2 * {num_heads} * "
            f"{head_k} + {num_v_heads} * {head_v} = {channels} for this state pool"
        )
    v_like = torch.empty(0, num_v_heads, head_v, dtype=x.dtype, device=x.device)
    check_state_pool(op, state, v_like, head_k)
    check_dtype(op, "state_slots", state_slots, (torch.int64, torch.int32))
    check_shape(op, "state_slots", state_slots, (x.shape[0],))
    check_contiguous(op, "state_slots", state_slots)


def _check_norm(op, x, num_v_heads, head_v, norm_gate, norm_weight) -> None:
    if norm_gate is None or norm_weight is None:
        raise ValueError(f"{op}: give norm_gate and norm_weight together, or neither")
    check_dtype(op, "norm_gate", norm_gate, (x.dtype,))
    check_shape(op, "norm_gate", norm_gate, (x.shape[0], num_v_heads, head_v))
    if norm_gate.shape[0] and (norm_gate.stride(2) != 1 or norm_gate.stride(1) != head_v):
        raise ValueError(
            f"{op}: norm_gate needs dense heads (strides (*, {head_v}, 1)), got "
            f"{norm_gate.stride()}: pass a view whose heads are contiguous"
        )
    check_dtype(op, "norm_weight", norm_weight, (x.dtype, torch.float32))
    check_shape(op, "norm_weight", norm_weight, (head_v,))
    check_contiguous(op, "norm_weight", norm_weight)


def conv_recurrent_gated_delta_rule(
    x: torch.Tensor,
    conv_weight: torch.Tensor,
    conv_state: torch.Tensor,
    a: torch.Tensor,
    b: torch.Tensor,
    A_log: torch.Tensor,
    dt_bias: torch.Tensor,
    state: torch.Tensor,
    *,
    state_slots: torch.Tensor,
    num_heads: int,
    scale: float | None = None,
    use_qk_l2norm: bool = True,
    norm_gate: torch.Tensor | None = None,
    norm_weight: torch.Tensor | None = None,
    norm_eps: float = 1e-6,
) -> torch.Tensor:
    """One decode token per sequence: the causal conv then the recurrent delta-rule step.

    What `causal_conv1d_update` then `fused_recurrent_gated_delta_rule` on its [q | k | v]
    split compute, with both states updated in place.

    Args:
        x: [B, C] pre-conv [q | k | v] rows (C = 2 * H * K + HV * V; rows may be strided).
        conv_weight: [C, W] depthwise filter.
        conv_state: [num_slots, W - 1, C] contiguous windows in x's dtype, oldest first.
        a: [B, HV] raw decay projection; g = -exp(A_log) * softplus(a + dt_bias) in fp32.
        b: [B, HV] raw write-strength projection; beta = sigmoid(b).
        A_log: [HV] log decay rate.
        dt_bias: [HV] decay bias.
        state: [num_slots, HV, K, V] fp32 contiguous state pool (gives HV, K and V).
        state_slots: [B] int64 slot per sequence; -1 is a padding row (skipped, output zero).
        num_heads: H, the key heads; value head j reads key head j // (HV // H).
        scale: query scale; defaults to K ** -0.5.
        use_qk_l2norm: l2-normalise q and k (fp32, eps 1e-6) inside the kernel.
        norm_gate: optional [B, HV, V] gate z (x's dtype; rows may be strided, heads dense): the
            output is then the gated RMSNorm `gated_rms_norm(o, norm_gate, norm_weight,
            norm_eps)` of the plain output o.
        norm_weight: [V] the gated norm's weight; given together with norm_gate.
        norm_eps: the gated norm's variance epsilon.

    Returns:
        o: [B, HV, V] in x.dtype.
    """
    op = "conv_recurrent_gated_delta_rule"
    _check_inputs(op, x, conv_weight, conv_state, state, state_slots, num_heads)
    num_v_heads, head_k, head_v = state.shape[1:]
    check_gate_inputs(op, a, b, A_log, dt_bias)
    check_shape(op, "a", a, (x.shape[0], num_v_heads))
    has_norm = norm_gate is not None or norm_weight is not None
    if has_norm:
        _check_norm(op, x, num_v_heads, head_v, norm_gate, norm_weight)
    tensors = {"x": x, "conv_weight": conv_weight, "conv_state": conv_state, "a": a, "b": b}
    check_device(op, tensors | {"A_log": A_log, "dt_bias": dt_bias, "state": state,
                                "state_slots": state_slots})  # fmt: skip
    num_seqs = x.shape[0]
    if current_phase() is not None or num_seqs * (num_heads + num_v_heads) > MAX_COUNTERS:
        # One tiling for every batch in the deterministic mode: the separate launches.
        y = causal_conv1d_update(x, conv_weight, conv_state, state_slots=state_slots)
        q, k, v = y.split((num_heads * head_k, num_heads * head_k, num_v_heads * head_v), -1)
        return fused_recurrent_gated_delta_rule(
            q.view(num_seqs, num_heads, head_k), k.view(num_seqs, num_heads, head_k),
            v.view(num_seqs, num_v_heads, head_v), a, b, A_log, dt_bias, state,
            state_slots=state_slots, scale=scale, use_qk_l2norm=use_qk_l2norm,
            norm_gate=norm_gate, norm_weight=norm_weight, norm_eps=norm_eps,
        )  # fmt: skip
    bv = BV_LARGE_BATCH if num_seqs >= LARGE_BATCH else BV_SMALL_BATCH
    return launch_conv_recurrent(
        x, conv_weight, conv_state, a, b, A_log, dt_bias, state, state_slots, num_heads,
        scale, use_qk_l2norm, norm_gate, norm_weight, norm_eps,
        bv=min(bv, triton.next_power_of_2(head_v)), num_warps=NUM_WARPS,
    )  # fmt: skip


def launch_conv_recurrent(
    x, conv_weight, conv_state, a, b, A_log, dt_bias, state, state_slots, num_heads, scale,
    use_qk_l2norm, norm_gate, norm_weight, norm_eps, *, bv: int, num_warps: int,
) -> torch.Tensor:  # fmt: skip
    """The fused launch with an explicit V tile and warps (the benchmark sweeps them)."""
    num_seqs = x.shape[0]
    num_v_heads, head_k, head_v = state.shape[1:]
    o = torch.empty(num_seqs, num_v_heads, head_v, dtype=x.dtype, device=x.device)
    if num_seqs == 0:
        return o
    scale = head_k**-0.5 if scale is None else scale
    counters = arrival_counters(x.device, "conv_recurrent_gated_delta_rule")
    gate, weight, has_norm = o, o, False  # placeholders the kernel reads only with the norm
    if norm_gate is not None and norm_weight is not None:
        gate, weight, has_norm = norm_gate, norm_weight, True
    pdl = dependent_launch(x)
    _conv_recurrent_kernel[(triton.cdiv(head_v, bv), num_seqs * num_v_heads)](
        x, conv_weight, conv_state, a, b, A_log, dt_bias, state, state_slots, o, gate, weight,
        counters, counters[num_seqs * num_heads :],
        x.stride(0), conv_weight.stride(0), a.stride(0), b.stride(0), gate.stride(0),
        scale, norm_eps,
        H=num_heads, HV=num_v_heads, K=head_k, V=head_v, W=conv_weight.shape[1],
        BK=triton.next_power_of_2(head_k), BV=bv, BVH=triton.next_power_of_2(head_v),
        BR=triton.next_power_of_2(conv_weight.shape[1] - 1), USE_QK_L2NORM=use_qk_l2norm,
        USE_PDL=pdl, GATED_NORM=has_norm,
        ROUND_PRODUCT=has_norm and rounds_weight_product(weight, x),
        num_warps=num_warps, launch_pdl=pdl,
    )  # fmt: skip
    return o
