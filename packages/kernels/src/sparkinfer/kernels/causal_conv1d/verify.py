"""Causal conv1d update for speculative verify: every position of a sequence in one launch with
the window left as it was, then a commit that shifts the accepted inputs into it.

`causal_conv1d_verify`: position t of a sequence convolves the window the decode update would
hold there (the slot's window followed by the sequence's inputs before t), read as the decode
update reads it, a [BR, BC] tile summed over its rows, so each row's output has the bits of a
one-token decode update at that position. The slot's window is only read.
`causal_conv1d_commit`: the slot's window becomes the last W - 1 of (window, the first num_kept
inputs): what num_kept decode updates leave, a copy without arithmetic.
"""

# Triton's annotations misread valid kernel code: constexpr and launch arguments.
# pyright: reportArgumentType=false, reportCallIssue=false

import torch
import triton
import triton.language as tl
from sparkinfer.kernels._triton import check_contiguous, check_device, check_dtype, check_shape
from sparkinfer.kernels.causal_conv1d.fused import UPDATE_BC, _check_conv_inputs, _silu


@triton.jit
def _window_rows(x, conv_state, p_rows, slot, t, o_r, o_c, m_r, m_c, C, stride_xb,
                 W: tl.constexpr):  # fmt: skip
    """[BR, BC] window before position t, oldest first: rows from the slot's window before the
    sequence's first position, rows of x (through p_rows) after."""
    o_src = t - (W - 1) + o_r  # the position each window row holds; < 0: the slot's window
    m_x = m_r & (o_src >= 0)
    m_s = m_r & (o_src < 0)
    b_row = tl.load(p_rows + o_src, mask=m_x, other=0).to(tl.int64)
    b_from_x = tl.load(x + b_row[:, None] * stride_xb + o_c[None, :],
                       mask=m_x[:, None] & m_c[None, :], other=0.0)  # fmt: skip
    o_old = slot * (W - 1) + (W - 1) + o_src
    b_from_s = tl.load(conv_state + o_old[:, None] * C + o_c[None, :],
                       mask=m_s[:, None] & m_c[None, :], other=0.0)  # fmt: skip
    return tl.where(m_x[:, None], b_from_x, b_from_s)


@triton.jit(do_not_specialize=["T"])  # positions of the step: one build for all
def _causal_conv1d_verify_kernel(
    x, weight, conv_state, y, x_out, state_slots, verify_rows, T, C, stride_xb, stride_wc,
    W: tl.constexpr, BR: tl.constexpr, BC: tl.constexpr, COPY_X: tl.constexpr,
):  # fmt: skip
    i_n, i_c = tl.program_id(0).to(tl.int64), tl.program_id(1).to(tl.int64)
    o_c = i_c * BC + tl.arange(0, BC)
    m_c = o_c < C
    o_r = tl.arange(0, BR)
    m_r = o_r < W - 1
    m_rc = m_r[:, None] & m_c[None, :]
    slot = tl.load(state_slots + i_n).to(tl.int64)
    p_rows = verify_rows + i_n * T
    # The decode update's weight tiles.
    b_w = tl.load(weight + o_c[None, :] * stride_wc + o_r[:, None], mask=m_rc, other=0.0)
    b_w = b_w.to(tl.float32)
    b_w_last = tl.load(weight + o_c * stride_wc + (W - 1), mask=m_c, other=0.0).to(tl.float32)
    for t in range(0, T):
        row = tl.load(p_rows + t).to(tl.int64)
        if row >= 0:
            p_y = y + row * C + o_c
            if COPY_X:
                b_in = tl.load(x + row * stride_xb + o_c, mask=m_c, other=0.0)
                tl.store(x_out + row * C + o_c, b_in, mask=m_c)
            if slot < 0:
                tl.store(p_y, tl.zeros([BC], dtype=tl.float32).to(y.dtype.element_ty), mask=m_c)
            else:
                b_win = _window_rows(x, conv_state, p_rows, slot, t, o_r, o_c, m_r, m_c, C,
                                     stride_xb, W)  # fmt: skip
                b_x = tl.load(x + row * stride_xb + o_c, mask=m_c, other=0.0)
                b_acc = tl.sum(b_win.to(tl.float32) * b_w, 0) + b_x.to(tl.float32) * b_w_last
                tl.store(p_y, _silu(b_acc).to(y.dtype.element_ty), mask=m_c)


@triton.jit(do_not_specialize=["T"])
def _causal_conv1d_commit_kernel(
    x, conv_state, state_slots, verify_rows, num_kept, T, C, stride_xb,
    W: tl.constexpr, BR: tl.constexpr, BC: tl.constexpr,
):  # fmt: skip
    i_n, i_c = tl.program_id(0).to(tl.int64), tl.program_id(1).to(tl.int64)
    slot = tl.load(state_slots + i_n).to(tl.int64)
    n = tl.load(num_kept + i_n).to(tl.int32)
    if (slot < 0) | (n <= 0):
        return
    o_c = i_c * BC + tl.arange(0, BC)
    m_c = o_c < C
    o_r = tl.arange(0, BR)
    m_r = o_r < W - 1
    p_rows = verify_rows + i_n * T
    b_win = _window_rows(x, conv_state, p_rows, slot, n, o_r, o_c, m_r, m_c, C, stride_xb, W)
    tl.debug_barrier()  # every read of the old window precedes the writes
    p_state = conv_state + slot * (W - 1) * C + o_r[:, None] * C + o_c[None, :]
    tl.store(p_state, b_win.to(conv_state.dtype.element_ty), mask=m_r[:, None] & m_c[None, :])


def _check_layout(op: str, x: torch.Tensor, state_slots: torch.Tensor, verify_rows: torch.Tensor):
    check_dtype(op, "state_slots", state_slots, (torch.int64, torch.int32))
    check_contiguous(op, "state_slots", state_slots)
    check_dtype(op, "verify_rows", verify_rows, (torch.int64, torch.int32))
    if verify_rows.ndim != 2 or verify_rows.shape[0] != state_slots.shape[0]:
        raise ValueError(
            f"{op}: verify_rows has shape {list(verify_rows.shape)} for {state_slots.shape[0]} "
            "state slots; expected [B, T], one row of positions per sequence"
        )
    check_contiguous(op, "verify_rows", verify_rows)
    check_device(op, {"x": x, "state_slots": state_slots, "verify_rows": verify_rows})


def causal_conv1d_verify(
    x: torch.Tensor,
    weight: torch.Tensor,
    conv_state: torch.Tensor,
    *,
    state_slots: torch.Tensor,
    verify_rows: torch.Tensor,
    out: torch.Tensor | None = None,
    x_out: torch.Tensor | None = None,
) -> torch.Tensor:
    """Each sequence's positions as consecutive decode updates from its slot's window, which is
    left untouched.

    Args:
        x: [N, C] pre-conv inputs of every verified row (rows may be strided).
        weight: [C, W] depthwise filter.
        conv_state: [num_slots, W - 1, C] contiguous windows in x's dtype, oldest first; read only.
        state_slots: [B] int64 slot per sequence; -1 is a padding sequence (its rows zero).
        verify_rows: [B, T] int64 row of position t of sequence i, -1 past its last position;
            every row of N belongs to one (i, t).
        out: where y goes, [N, C] contiguous in x.dtype (the layer's verify stash, so no copy
            follows); None: a new tensor.
        x_out: where a copy of x goes, [N, C] contiguous in x.dtype (the stash's inputs, for
            the commit), written as the rows are read; None: no copy.

    Returns:
        y: [N, C] in x.dtype (`out` where given).
    """
    op = "causal_conv1d_verify"
    _check_conv_inputs(op, x, weight, conv_state)
    _check_layout(op, x, state_slots, verify_rows)
    check_device(op, {"x": x, "weight": weight, "conv_state": conv_state})
    num_rows, channels = x.shape
    width = weight.shape[1]
    if out is None:
        y = torch.empty(num_rows, channels, dtype=x.dtype, device=x.device)
    else:
        check_dtype(op, "out", out, (x.dtype,))
        check_shape(op, "out", out, (num_rows, channels))
        check_contiguous(op, "out", out)
        check_device(op, {"x": x, "out": out})
        y = out
    if x_out is not None:
        check_dtype(op, "x_out", x_out, (x.dtype,))
        check_shape(op, "x_out", x_out, (num_rows, channels))
        check_contiguous(op, "x_out", x_out)
        check_device(op, {"x": x, "x_out": x_out})
    num_seqs = state_slots.shape[0]
    if num_rows and num_seqs:
        _causal_conv1d_verify_kernel[(num_seqs, triton.cdiv(channels, UPDATE_BC))](
            x, weight, conv_state, y, y if x_out is None else x_out, state_slots, verify_rows,
            verify_rows.shape[1], channels, x.stride(0), weight.stride(0),
            W=width, BR=triton.next_power_of_2(width - 1), BC=UPDATE_BC, COPY_X=x_out is not None,
        )  # fmt: skip
    return y


def causal_conv1d_commit(
    x: torch.Tensor,
    conv_state: torch.Tensor,
    *,
    state_slots: torch.Tensor,
    verify_rows: torch.Tensor,
    num_kept: torch.Tensor,
) -> None:
    """Shift each sequence's first num_kept verified inputs into the window of its slot.

    Args:
        x: [N, C] the verify's pre-conv inputs, by verify row (rows may be strided).
        conv_state: [num_slots, W - 1, C] contiguous windows in x's dtype, oldest first; row
            state_slots[i] becomes the last W - 1 of (its window, the first num_kept[i] inputs).
        state_slots: [B] int64 slot per sequence; -1 is a padding sequence (skipped).
        verify_rows: [B, T] int64 row of position t of sequence i (as given to the verify).
        num_kept: [B] int64 positions to apply, 0 to T (0: the window stays).
    """
    op = "causal_conv1d_commit"
    if x.ndim != 2 or conv_state.ndim != 3 or conv_state.shape[2] != x.shape[1]:
        raise ValueError(
            f"{op}: x {list(x.shape)} and conv_state {list(conv_state.shape)}; expected [N, C] "
            "and [num_slots, W - 1, C]"
        )
    if conv_state.dtype != x.dtype:
        raise TypeError(f"{op}: conv_state has dtype {conv_state.dtype}; expected x's {x.dtype}")
    check_contiguous(op, "conv_state", conv_state)
    if x.stride(1) != 1:
        raise ValueError(f"{op}: x has strides {x.stride()}; expected a contiguous last dim")
    _check_layout(op, x, state_slots, verify_rows)
    check_dtype(op, "num_kept", num_kept, (torch.int64, torch.int32))
    check_shape(op, "num_kept", num_kept, tuple(state_slots.shape))
    check_device(op, {"x": x, "conv_state": conv_state, "num_kept": num_kept})
    num_seqs, channels = state_slots.shape[0], x.shape[1]
    width = conv_state.shape[1] + 1
    if num_seqs and x.shape[0]:
        _causal_conv1d_commit_kernel[(num_seqs, triton.cdiv(channels, UPDATE_BC))](
            x, conv_state, state_slots, verify_rows, num_kept, verify_rows.shape[1], channels,
            x.stride(0), W=width, BR=triton.next_power_of_2(width - 1), BC=UPDATE_BC,
        )  # fmt: skip
