"""Rotary cos/sin tables: interleaved MRoPE over (t, h, w) positions, partial rotary (model.md §8).

Only the first `rotary_dim` dims of each head rotate (rotate_half style). Frequency j takes its
angle from one of the three position axes: H for j % 3 == 1 within the first 3 * section[1]
frequencies, W for j % 3 == 2 within the first 3 * section[2], T otherwise. Text positions ([T])
are the same as all three axes equal, i.e. plain 1-D rope.
"""

from __future__ import annotations

import torch
from torch import nn


def mrope_axis_of_frequency(num_freqs: int, mrope_section: tuple[int, int, int]) -> torch.Tensor:
    """[num_freqs] int64: 0 (T), 1 (H) or 2 (W) for each frequency, interleaved as in HF."""
    axis = torch.zeros(num_freqs, dtype=torch.int64)
    for dim, offset in ((1, 1), (2, 2)):
        axis[offset : mrope_section[dim] * 3 : 3] = dim
    return axis


class RotaryEmbedding(nn.Module):
    """Computes cos/sin [T, rotary_dim] fp32 from [T] or [3, T] int positions."""

    inv_freq: torch.Tensor  # [R/2] fp32 buffer
    axis_of_freq: torch.Tensor  # [R/2] int64 buffer

    def __init__(
        self,
        rotary_dim: int,
        theta: float,
        mrope_section: tuple[int, int, int],
        *,
        device: torch.device,
    ) -> None:
        super().__init__()
        # Same expression as transformers, so fp32 angles match bit for bit.
        inv_freq = 1.0 / (theta ** (torch.arange(0, rotary_dim, 2, dtype=torch.float) / rotary_dim))
        self.register_buffer("inv_freq", inv_freq.to(device), persistent=False)
        axis = mrope_axis_of_frequency(rotary_dim // 2, mrope_section).to(device)
        self.register_buffer("axis_of_freq", axis, persistent=False)

    def forward(self, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """positions [T] or [3, T] (t, h, w) -> (cos, sin), each [T, rotary_dim] fp32."""
        if positions.dim() == 1:
            freqs = positions[:, None].float() * self.inv_freq  # [T, R/2]
        else:
            per_freq = positions.index_select(0, self.axis_of_freq)  # [R/2, T]
            freqs = per_freq.t().float() * self.inv_freq
        emb = torch.cat((freqs, freqs), dim=-1)  # [T, R]
        return emb.cos(), emb.sin()
