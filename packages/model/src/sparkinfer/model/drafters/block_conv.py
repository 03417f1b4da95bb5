"""DFlash2's in-block convolution around each drafter layer's attention and MLP.

A grouped, causal convolution along the block's rows (row j mixes rows j, j-1, ..., j-K+1 of its
own block; rows before the block count as zero) whose kernel is a learnt base plus a part that
each row predicts from its own input: for the channels of group g,

    y[j] = sum_o (base[o] + dyn[j, o, g]) * x[j - o],   o = 0 .. K-1

`kernel_projection` predicts two such dynamic kernels from the sublayer's input: the first
convolves that input (`prepare`), the second the sublayer's output (`finish`); `base_kernel`
[2, K, hidden] holds the two base kernels.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from sparkinfer.model.layers import KernelOps, new_parameter
from sparkinfer.model.layers.linear import Linear
from torch import nn


def grouped_causal_conv(
    x: torch.Tensor, dynamic: torch.Tensor, base: torch.Tensor, group_size: int
) -> torch.Tensor:
    """x [B, S, hidden], dynamic [B, S, K, G], base [K, hidden] -> y [B, S, hidden] (G groups
    of `group_size` channels; the convolution runs along S)."""
    b, s, hidden = x.shape
    num_groups = hidden // group_size
    xg = x.view(b, s, num_groups, group_size)
    y = torch.zeros_like(xg)
    for o in range(base.shape[0]):
        shifted = xg if o == 0 else F.pad(xg[:, : s - o], (0, 0, 0, 0, o, 0))
        kernel = base[o].view(num_groups, group_size).to(x.dtype) + dynamic[:, :, o, :, None]
        y = y + kernel * shifted
    return y.view(b, s, hidden)


class InBlockConv(nn.Module):
    """`layers.N.attention_conv` / `layers.N.mlp_conv` of a DFlash2 drafter."""

    def __init__(
        self,
        hidden_size: int,
        kernel_size: int,
        group_size: int,
        *,
        ops: KernelOps,
        device: torch.device,
        dtype: torch.dtype,
    ) -> None:
        super().__init__()
        self.kernel_size, self.group_size = kernel_size, group_size
        num_groups = hidden_size // group_size
        self.base_kernel = new_parameter(2, kernel_size, hidden_size, device=device, dtype=dtype)
        self.kernel_projection = Linear(
            hidden_size, 2 * kernel_size * num_groups, ops=ops, device=device, dtype=dtype
        )

    def prepare(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """x [B, S, hidden] -> (x convolved with the first kernel, the second dynamic kernel
        [B, S, K, G] for `finish`)."""
        b, s, hidden = x.shape
        dyn = self.kernel_projection(x.reshape(b * s, hidden))
        dyn = dyn.view(b, s, 2, self.kernel_size, hidden // self.group_size)
        y = grouped_causal_conv(x, dyn[:, :, 0], self.base_kernel[0], self.group_size)
        return y, dyn[:, :, 1]

    def finish(self, y: torch.Tensor, dynamic: torch.Tensor) -> torch.Tensor:
        """The sublayer's output [B, S, hidden] convolved with the second kernel."""
        return grouped_causal_conv(y, dynamic, self.base_kernel[1], self.group_size)
