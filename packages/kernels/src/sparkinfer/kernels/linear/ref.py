"""Plain-torch linear layer without bias, with the SwiGLU after it, and with the causal conv's
decode step on its first columns: the specifications of `linear`, `linear_swiglu` and
`linear_conv_update`."""

from __future__ import annotations

import torch
from sparkinfer.kernels.activation import silu_and_mul_ref
from sparkinfer.kernels.causal_conv1d.ref import causal_conv1d_update_ref


def linear_ref(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """y = x @ weight.T, accumulated in fp32.

    Args:
        x: [M, K] activations (bf16 or fp32).
        weight: [N, K] weight in the checkpoint's layout, same dtype as x.

    Returns:
        y: [M, N] in x.dtype.
    """
    return (x.float() @ weight.float().T).to(x.dtype)


def linear_swiglu_ref(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """silu(gate) * up for [gate | up] = x @ weight.T.

    Args:
        x: [M, K] activations (bf16, fp16 or fp32), unit stride along K.
        weight: [2 * I, K] gate_proj and up_proj stacked by rows, same dtype.

    Returns:
        y: [M, I] in x.dtype.
    """
    return silu_and_mul_ref(linear_ref(x, weight))


def linear_conv_update_ref(
    x: torch.Tensor,
    weight: torch.Tensor,
    conv_weight: torch.Tensor,
    conv_state: torch.Tensor,
    *,
    state_slots: torch.Tensor,
) -> torch.Tensor:
    """y = x @ weight.T, then `causal_conv1d_update` on its first C columns.

    Args:
        x: [M, K] activations (bf16, fp16 or fp32); one row per sequence.
        weight: [N, K] weight, same dtype; its first C rows feed the conv.
        conv_weight: [C, W] depthwise filter.
        conv_state: [num_slots, W - 1, C] windows in x's dtype, oldest first; row
            ``state_slots[i]`` gains y[i, :C] and drops its oldest input.
        state_slots: [M] int64 slot per row; -1 is a padding row (its first C columns are zero).

    Returns:
        y: [M, N] in x.dtype.
    """
    y = linear_ref(x, weight)
    channels = conv_weight.shape[0]
    y[:, :channels] = causal_conv1d_update_ref(
        y[:, :channels], conv_weight, conv_state, state_slots=state_slots
    )
    return y
