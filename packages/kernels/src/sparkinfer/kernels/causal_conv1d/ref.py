"""Plain-torch references for the causal depthwise conv1d + SiLU: the specification.

The conv state of a sequence holds its last W - 1 pre-conv inputs, oldest first.
"""

import torch
import torch.nn.functional as F


def _conv_silu(window: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """silu(sum_j weight[:, j] * window[t + j]) per t; window [N + W - 1, C] fp32 -> [N, C]."""
    width = weight.shape[1]
    num_out = window.shape[0] - width + 1
    w = weight.float()
    acc = torch.zeros(num_out, window.shape[1], dtype=torch.float32, device=window.device)
    for j in range(width):
        acc += w[:, j] * window[j : j + num_out]
    return F.silu(acc)


def causal_conv1d_ref(
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
        x: [T, C] pre-conv inputs.
        weight: [C, W] depthwise filter; y[t] = silu(sum_j weight[:, j] * x[t - W + 1 + j]).
        conv_state: [num_slots, W - 1, C] last W - 1 inputs per slot, oldest first;
            updated in place.
        cu_seqlens: [B + 1] int32 sequence starts in T.
        state_slots: [B] int64 slot per sequence; -1 is a padding row (state untouched,
            output zero).
        has_initial_state: [B] bool; True starts from the slot's window, False from zeros.

    Returns:
        y: [T, C] in x.dtype. Each sequence's last W - 1 inputs (reaching into the initial window
        when the sequence is shorter than W - 1) are written back to ``conv_state[slot]``.
    """
    y = torch.zeros(x.shape, dtype=torch.float32, device=x.device)
    bounds = cu_seqlens.tolist()
    state_len = weight.shape[1] - 1
    for i, slot in enumerate(state_slots.tolist()):
        if slot < 0:
            continue
        bos, eos = bounds[i], bounds[i + 1]
        if bool(has_initial_state[i]):
            init = conv_state[slot].float()
        else:
            init = torch.zeros(state_len, x.shape[1], dtype=torch.float32, device=x.device)
        window = torch.cat([init, x[bos:eos].float()])  # [W - 1 + len, C]
        y[bos:eos] = _conv_silu(window, weight)
        conv_state[slot] = window[window.shape[0] - state_len :].to(conv_state.dtype)
    return y.to(x.dtype)


def causal_conv1d_update_ref(
    x: torch.Tensor,
    weight: torch.Tensor,
    conv_state: torch.Tensor,
    *,
    state_slots: torch.Tensor,
    early_state: bool = False,
) -> torch.Tensor:
    """One decode token per sequence: conv over (window, x) then SiLU, window shifted in place.

    Args:
        x: [B, C] the new pre-conv input of each sequence.
        weight: [C, W] depthwise filter.
        conv_state: [num_slots, W - 1, C] windows, oldest first; row ``state_slots[i]`` gains x[i]
            and drops its oldest input.
        state_slots: [B] int64 slot per sequence; -1 is a padding row (skipped, output zero).
        early_state: the fast op's launch option; no effect here.

    Returns:
        y: [B, C] in x.dtype.
    """
    y = torch.zeros(x.shape, dtype=torch.float32, device=x.device)
    for i, slot in enumerate(state_slots.tolist()):
        if slot < 0:
            continue
        window = torch.cat([conv_state[slot].float(), x[i : i + 1].float()])  # [W, C]
        y[i] = _conv_silu(window, weight)[0]
        conv_state[slot] = window[1:].to(conv_state.dtype)
    return y.to(x.dtype)


def causal_conv1d_verify_ref(
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
        x: [N, C] pre-conv inputs of every verified row.
        weight: [C, W] depthwise filter.
        conv_state: [num_slots, W - 1, C] windows, oldest first; read only.
        state_slots: [B] int64 slot per sequence; -1 is a padding sequence (its rows zero).
        verify_rows: [B, T] int64 row of position t of sequence i, -1 past its last position.
        out: where y goes, [N, C] in x.dtype; None: a new tensor.
        x_out: where a copy of x goes, [N, C] in x.dtype; None: no copy.

    Returns:
        y: [N, C] in x.dtype (`out` where given).
    """
    if x_out is not None:
        x_out.copy_(x)
    y = torch.zeros(x.shape, dtype=torch.float32, device=x.device)
    for slot, rows in zip(state_slots.tolist(), verify_rows.tolist(), strict=True):
        if slot < 0:
            continue
        window = conv_state[slot].float()
        for r in (r for r in rows if r >= 0):
            window = torch.cat([window, x[r : r + 1].float()])  # [W, C]
            y[r] = _conv_silu(window, weight)[0]
            window = window[1:]
    return y.to(x.dtype) if out is None else out.copy_(y)


def causal_conv1d_commit_ref(
    x: torch.Tensor,
    conv_state: torch.Tensor,
    *,
    state_slots: torch.Tensor,
    verify_rows: torch.Tensor,
    num_kept: torch.Tensor,
) -> None:
    """Shift each sequence's first num_kept verified inputs into the window of its slot.

    Args:
        x: [N, C] the verify's pre-conv inputs, by verify row.
        conv_state: [num_slots, W - 1, C] windows, oldest first; row state_slots[i] becomes the
            last W - 1 of (its window, the first num_kept[i] inputs).
        state_slots: [B] int64 slot per sequence; -1 is a padding sequence (skipped).
        verify_rows: [B, T] int64 row of position t of sequence i (as given to the verify).
        num_kept: [B] int64 positions to apply, 0 to T (0: the window stays).
    """
    state_len = conv_state.shape[1]
    seqs = zip(state_slots.tolist(), verify_rows.tolist(), num_kept.tolist(), strict=True)
    for slot, rows, n in seqs:
        if slot < 0 or n <= 0:
            continue
        window = torch.cat([conv_state[slot], x[rows[:n]].to(conv_state.dtype)])
        conv_state[slot] = window[window.shape[0] - state_len :]
