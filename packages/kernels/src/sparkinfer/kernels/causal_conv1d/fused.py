"""Causal depthwise conv1d fused with SiLU: varlen prefill with conv-state out, and decode update.

The conv state of a slot holds its last W - 1 pre-conv inputs, oldest first: [num_slots, W - 1, C].
Prefill runs two kernels: the conv reads the initial windows, then a second launch writes the final
windows back, so that no program overwrites a window another one still reads. The decode update
can read its windows before it waits on the kernel before it (`early_state`, dependent launch).
"""

# Triton's annotations misread valid kernel code: constexpr and launch arguments, tl.static_range.
# pyright: reportArgumentType=false, reportCallIssue=false, reportGeneralTypeIssues=false
# pyright: reportPossiblyUnboundVariable=false

import torch
import triton
import triton.language as tl
from sparkinfer.kernels._triton import (
    check_contiguous,
    check_device,
    check_dtype,
    check_last_dim_contiguous,
    check_ndim,
    check_shape,
    check_varlen_batch,
)
from sparkinfer.kernels.dependent_launch import dependent_launch, wait_for_prior_kernels

FLOAT_DTYPES = (torch.bfloat16, torch.float16, torch.float32)
BT = 16  # prefill tokens per program; its W - 1 + BT input rows live in registers, bounding it
BC = 128  # prefill channels per program, 4 per thread
BB = 32  # cu_seqlens entries a prefill program compares per step to find its sequence
UPDATE_BC = 128  # channels per program of the decode update and the conv-state write-back


@triton.jit
def _silu(b_x):
    return b_x / (1.0 + tl.exp(-b_x))


@triton.jit
def _seq_of_token(cu_seqlens, num_seqs, t, BB: tl.constexpr):
    """Index of the sequence holding token t: how many sequences end at or before t."""
    i_n = tl.full([], 0, tl.int32)
    for i_k in range(0, num_seqs, BB):
        o_k = i_k + tl.arange(0, BB)
        m_k = o_k < num_seqs
        b_eos = tl.load(cu_seqlens + 1 + o_k, mask=m_k, other=0)
        i_n += tl.sum((m_k & (b_eos <= t)).to(tl.int32), 0)
    return tl.minimum(i_n, num_seqs - 1)


@triton.jit
def _conv_rows(b_x, p_y, b_w, m_c, C, W: tl.constexpr, BT: tl.constexpr):
    """BT output rows from the W - 1 + BT input rows b_x, all of one sequence."""
    for r in tl.static_range(BT):
        b_acc = tl.zeros(p_y.shape, dtype=tl.float32)
        for j in tl.static_range(W):
            b_acc += b_x[r + j].to(tl.float32) * b_w[j]
        tl.store(p_y + r * C, _silu(b_acc).to(p_y.dtype.element_ty), mask=m_c)


@triton.jit
def _conv_rows_varlen(
    p_x, p_y, conv_state, cu_seqlens, state_slots, has_initial_state, b_w, o_c, m_c,
    t0, i_n, bos, eos, num_tokens, num_seqs, C, stride_xt,
    W: tl.constexpr, BT: tl.constexpr,
):  # fmt: skip
    """Rows t0 .. t0 + BT - 1 one at a time, for blocks near a sequence start or end.

    A tap before its sequence's start reads the initial window, or zero without one.
    """
    for r in range(0, tl.minimum(BT, num_tokens - t0)):
        t = t0 + r
        while (eos <= t) & (i_n < num_seqs - 1):
            i_n += 1
            bos = eos
            eos = tl.load(cu_seqlens + i_n + 1)
        slot = tl.load(state_slots + i_n).to(tl.int64)
        use_state = (tl.load(has_initial_state + i_n) != 0) & (slot >= 0)
        b_acc = tl.zeros(o_c.shape, dtype=tl.float32)
        for j in tl.static_range(W):
            o_src = t - (W - 1) + j  # input position read by tap j
            m_x = tl.where(o_src >= bos, m_c, False)
            b_x = tl.load(p_x + (r - (W - 1) + j) * stride_xt, mask=m_x, other=0.0)
            b_x = b_x.to(tl.float32)
            o_row = slot * (W - 1) + (W - 1) + o_src - bos  # row of the initial window
            m_s = tl.where(use_state & (o_src < bos), m_c, False)
            b_x += tl.load(conv_state + o_row * C + o_c, mask=m_s, other=0.0).to(tl.float32)
            b_acc += b_x * b_w[j]
        b_y = tl.where(slot >= 0, _silu(b_acc), 0.0)
        tl.store(p_y + r * C, b_y.to(p_y.dtype.element_ty), mask=m_c)


@triton.jit(do_not_specialize=["num_tokens", "num_seqs"])  # sizes of the step: one build for all
def _causal_conv1d_kernel(
    x, weight, conv_state, y, cu_seqlens, state_slots, has_initial_state,
    num_tokens, num_seqs, C, stride_xt, stride_wc,
    W: tl.constexpr, BT: tl.constexpr, BC: tl.constexpr, BB: tl.constexpr,
):  # fmt: skip
    """One [BT, BC] block of y: from rows in registers unless it reaches a sequence start."""
    i_t, i_c = tl.program_id(0), tl.program_id(1)
    t0 = i_t * BT
    o_c = i_c * BC + tl.arange(0, BC)
    m_c = o_c < C
    # Input rows t0 - W + 1 .. t0 + BT - 1 go out first: they do not wait for the lookup below.
    p_x = x + t0.to(tl.int64) * stride_xt + o_c
    b_x = ()
    for r in tl.static_range(1 - W, BT):
        # tl.where, not &: the interpreter mistypes a tensor & scalar mask.
        m_x = tl.where((t0 + r >= 0) & (t0 + r < num_tokens), m_c, False)
        b_x += (tl.load(p_x + r * stride_xt, mask=m_x, other=0.0),)
    b_w = ()
    for j in tl.static_range(W):
        b_w += (tl.load(weight + o_c * stride_wc + j, mask=m_c, other=0.0).to(tl.float32),)
    i_n = _seq_of_token(cu_seqlens, num_seqs, t0, BB)
    bos = tl.load(cu_seqlens + i_n)
    eos = tl.load(cu_seqlens + i_n + 1)
    slot = tl.load(state_slots + i_n)
    p_y = y + t0.to(tl.int64) * C + o_c
    # One sequence, and no tap reaches before its start: the rows loaded above are the whole input.
    if (bos <= t0 - (W - 1)) & (t0 + BT <= tl.minimum(eos, num_tokens)):
        if slot < 0:
            for r in tl.static_range(BT):
                tl.store(p_y + r * C, tl.zeros([BC], dtype=p_y.dtype.element_ty), mask=m_c)
        else:
            _conv_rows(b_x, p_y, b_w, m_c, C, W, BT)
    else:
        _conv_rows_varlen(
            p_x, p_y, conv_state, cu_seqlens, state_slots, has_initial_state, b_w, o_c, m_c,
            t0, i_n, bos, eos, num_tokens, num_seqs, C, stride_xt, W, BT,
        )  # fmt: skip


@triton.jit
def _conv_state_out_kernel(
    x, conv_state, cu_seqlens, state_slots, has_initial_state, C, stride_xt,
    W: tl.constexpr, BR: tl.constexpr, BC: tl.constexpr,
):  # fmt: skip
    i_n, i_c = tl.program_id(0).to(tl.int64), tl.program_id(1).to(tl.int64)
    slot = tl.load(state_slots + i_n).to(tl.int64)
    if slot < 0:
        return
    bos = tl.load(cu_seqlens + i_n).to(tl.int64)
    eos = tl.load(cu_seqlens + i_n + 1).to(tl.int64)
    has_init = tl.load(has_initial_state + i_n).to(tl.int32)
    o_r = tl.arange(0, BR)
    o_c = i_c * BC + tl.arange(0, BC)
    m_r, m_c = o_r < W - 1, o_c < C
    o_src = eos - (W - 1) + o_r  # the last W - 1 input positions
    m_x = (m_r & (o_src >= bos))[:, None] & m_c[None, :]
    m_s = (m_r & (o_src < bos) & (o_r * 0 + has_init > 0))[:, None] & m_c[None, :]
    b_x = tl.load(x + o_src[:, None] * stride_xt + o_c[None, :], mask=m_x, other=0.0)
    p_state = conv_state + slot * (W - 1) * C
    o_old = (W - 1) + o_src - bos  # older inputs come from the initial window
    b_x += tl.load(p_state + o_old[:, None] * C + o_c[None, :], mask=m_s, other=0.0)
    tl.debug_barrier()  # every read of the old window precedes the writes
    p_new = p_state + o_r[:, None] * C + o_c[None, :]
    tl.store(p_new, b_x.to(conv_state.dtype.element_ty), mask=m_r[:, None] & m_c[None, :])


@triton.jit
def _causal_conv1d_update_kernel(
    x, weight, conv_state, y, state_slots, C, stride_xb, stride_wc,
    W: tl.constexpr, BR: tl.constexpr, BC: tl.constexpr, EARLY_STATE: tl.constexpr,
    USE_PDL: tl.constexpr,
):  # fmt: skip
    i_n, i_c = tl.program_id(0).to(tl.int64), tl.program_id(1).to(tl.int64)
    o_c = i_c * BC + tl.arange(0, BC)
    m_c = o_c < C
    o_r = tl.arange(0, BR)
    m_r = o_r < W - 1
    m_rc = m_r[:, None] & m_c[None, :]
    m_shift = (o_r < W - 2)[:, None] & m_c[None, :]
    o_rc = o_r[:, None] * C + o_c[None, :]
    if EARLY_STATE:  # the caller vouches the kernel before writes neither slots nor windows
        slot = tl.load(state_slots + i_n).to(tl.int64)
        # a padding row (slot -1) reads slot 0 and never uses it
        p_read = conv_state + tl.maximum(slot, 0) * (W - 1) * C + o_rc
        b_win = tl.load(p_read, mask=m_rc, other=0.0)  # [BR, BC], oldest first
        b_next = tl.load(p_read + C, mask=m_shift, other=0.0)
    wait_for_prior_kernels(USE_PDL)
    if not EARLY_STATE:
        slot = tl.load(state_slots + i_n).to(tl.int64)
    p_y = y + i_n * C + o_c
    if slot < 0:
        tl.store(p_y, tl.zeros([BC], dtype=tl.float32).to(y.dtype.element_ty), mask=m_c)
        return
    p_state = conv_state + slot * (W - 1) * C + o_rc
    if not EARLY_STATE:
        b_win = tl.load(p_state, mask=m_rc, other=0.0)
        b_next = tl.load(p_state + C, mask=m_shift, other=0.0)
    b_x = tl.load(x + i_n * stride_xb + o_c, mask=m_c, other=0.0)
    p_w = weight + o_c[None, :] * stride_wc + o_r[:, None]
    b_w = tl.load(p_w, mask=m_rc, other=0.0).to(tl.float32)
    b_w_last = tl.load(weight + o_c * stride_wc + (W - 1), mask=m_c, other=0.0).to(tl.float32)
    b_acc = tl.sum(b_win.to(tl.float32) * b_w, 0) + b_x.to(tl.float32) * b_w_last
    # Shifted window: row r takes old row r + 1, the newest row takes x.
    b_next = tl.where((o_r == W - 2)[:, None], b_x[None, :].to(b_next.dtype), b_next)
    tl.debug_barrier()  # every read of the old window precedes the writes
    tl.store(p_state, b_next, mask=m_rc)
    tl.store(p_y, _silu(b_acc).to(y.dtype.element_ty), mask=m_c)


def _check_conv_inputs(op: str, x: torch.Tensor, weight: torch.Tensor, conv_state: torch.Tensor):
    check_ndim(op, "x", x, 2, "[T, C]")
    check_dtype(op, "x", x, FLOAT_DTYPES)
    check_last_dim_contiguous(op, "x", x)
    check_ndim(op, "weight", weight, 2, "[C, W]")
    check_dtype(op, "weight", weight, FLOAT_DTYPES)
    check_last_dim_contiguous(op, "weight", weight)
    channels, width = weight.shape
    if width < 2:
        raise ValueError(f"{op}: weight has shape {list(weight.shape)}; expected [C, W], W >= 2")
    if x.shape[1] != channels:
        raise ValueError(f"{op}: x has {x.shape[1]} channels but weight has {channels}")
    check_ndim(op, "conv_state", conv_state, 3, "[num_slots, W - 1, C]")
    check_shape(op, "conv_state", conv_state, (conv_state.shape[0], width - 1, channels))
    if conv_state.dtype != x.dtype:
        raise TypeError(f"{op}: conv_state has dtype {conv_state.dtype}; expected x's {x.dtype}")
    check_contiguous(op, "conv_state", conv_state)


def causal_conv1d(
    x: torch.Tensor,
    weight: torch.Tensor,
    conv_state: torch.Tensor,
    *,
    cu_seqlens: torch.Tensor,
    state_slots: torch.Tensor,
    has_initial_state: torch.Tensor,
) -> torch.Tensor:
    """Causal depthwise conv1d then SiLU over a packed (varlen) prefill batch.

    Args:
        x: [T, C] pre-conv inputs (bf16, fp16 or fp32; rows may be strided).
        weight: [C, W] depthwise filter; y[t] = silu(sum_j weight[:, j] * x[t - W + 1 + j]).
        conv_state: [num_slots, W - 1, C] contiguous, x's dtype: last W - 1 inputs per slot,
            oldest first; updated in place.
        cu_seqlens: [B + 1] int32 sequence starts in T.
        state_slots: [B] int64 slot per sequence; -1 is a padding row (state untouched,
            output zero).
        has_initial_state: [B] bool; True starts from the slot's window, False from zeros.

    Returns:
        y: [T, C] in x.dtype. Each sequence's last W - 1 inputs (reaching into the initial window
        when the sequence is shorter than W - 1) are written back to ``conv_state[slot]``.
    """
    op = "causal_conv1d"
    _check_conv_inputs(op, x, weight, conv_state)
    check_varlen_batch(op, cu_seqlens, state_slots, has_initial_state)
    tensors = {"x": x, "weight": weight, "conv_state": conv_state, "cu_seqlens": cu_seqlens}
    check_device(op, tensors | {"state_slots": state_slots, "has_initial_state": has_initial_state})
    num_tokens, channels = x.shape
    width = weight.shape[1]
    num_seqs = state_slots.shape[0]
    has_init = has_initial_state.view(torch.uint8)
    y = torch.empty(num_tokens, channels, dtype=x.dtype, device=x.device)
    if num_tokens > 0:
        _causal_conv1d_kernel[(triton.cdiv(num_tokens, BT), triton.cdiv(channels, BC))](
            x, weight, conv_state, y, cu_seqlens, state_slots, has_init,
            num_tokens, num_seqs, channels, x.stride(0), weight.stride(0),
            W=width, BT=BT, BC=BC, BB=BB, num_warps=max(1, BC // 128),
        )  # fmt: skip
    _conv_state_out_kernel[(num_seqs, triton.cdiv(channels, UPDATE_BC))](
        x, conv_state, cu_seqlens, state_slots, has_init, channels, x.stride(0),
        W=width, BR=triton.next_power_of_2(width - 1), BC=UPDATE_BC,
    )  # fmt: skip
    return y


def causal_conv1d_update(
    x: torch.Tensor,
    weight: torch.Tensor,
    conv_state: torch.Tensor,
    *,
    state_slots: torch.Tensor,
    early_state: bool = False,
) -> torch.Tensor:
    """One decode token per sequence: conv over (window, x) then SiLU, window shifted in place.

    Args:
        x: [B, C] the new pre-conv input of each sequence (rows may be strided).
        weight: [C, W] depthwise filter.
        conv_state: [num_slots, W - 1, C] contiguous windows in x's dtype, oldest first; row
            ``state_slots[i]`` gains x[i] and drops its oldest input.
        state_slots: [B] int64 slot per sequence; -1 is a padding row (skipped, output zero).
        early_state: read the slots and windows before waiting on the kernel launched just
            before this one (dependent launch), so the reads overlap its tail. Pass True only
            when that kernel writes neither (the model's in_proj projection, for one).

    Returns:
        y: [B, C] in x.dtype.
    """
    op = "causal_conv1d_update"
    _check_conv_inputs(op, x, weight, conv_state)
    check_dtype(op, "state_slots", state_slots, (torch.int64, torch.int32))
    check_shape(op, "state_slots", state_slots, (x.shape[0],))
    check_contiguous(op, "state_slots", state_slots)
    tensors = {"x": x, "weight": weight, "conv_state": conv_state, "state_slots": state_slots}
    check_device(op, tensors)
    num_seqs, channels = x.shape
    width = weight.shape[1]
    y = torch.empty(num_seqs, channels, dtype=x.dtype, device=x.device)
    if num_seqs > 0:
        pdl = dependent_launch(x)
        _causal_conv1d_update_kernel[(num_seqs, triton.cdiv(channels, UPDATE_BC))](
            x, weight, conv_state, y, state_slots, channels, x.stride(0), weight.stride(0),
            W=width, BR=triton.next_power_of_2(width - 1), BC=UPDATE_BC,
            EARLY_STATE=early_state, USE_PDL=pdl, launch_pdl=pdl,
        )  # fmt: skip
    return y
