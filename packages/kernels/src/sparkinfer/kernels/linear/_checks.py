"""Operand checks shared by the linear kernels: clear errors before a Triton launch."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from sparkinfer.kernels._triton import check_device
from sparkinfer.kernels.causal_conv1d.fused import check_conv_weight_state, check_update_inputs

GEMM_DTYPES = (torch.bfloat16, torch.float16, torch.float32)


def check_gemm_operands(op: str, x: torch.Tensor, weight: torch.Tensor) -> None:
    """x [M, K] and weight [N, K]: same float dtype, same K, unit stride along K, one device."""
    if x.dim() != 2 or weight.dim() != 2:
        raise ValueError(
            f"{op}: x must be [M, K] and weight [N, K], got {tuple(x.shape)}, {tuple(weight.shape)}"
        )
    if x.dtype not in GEMM_DTYPES or weight.dtype != x.dtype:
        raise TypeError(
            f"{op}: x and weight must share bf16, fp16 or fp32, got {x.dtype} and {weight.dtype}"
        )
    if x.shape[1] != weight.shape[1]:
        raise ValueError(f"{op}: x has K={x.shape[1]} but weight [N, K] has K={weight.shape[1]}")
    if x.stride(1) != 1 or weight.stride(1) != 1:
        raise ValueError(
            f"{op}: x and weight need unit stride along K, got {x.stride()} and {weight.stride()}"
        )
    check_device(op, {"x": x, "weight": weight})


@dataclass(frozen=True)
class ConvUpdate:
    """The causal conv's decode step in a GEMM's epilogue: the first `channels` columns of y pass
    through the conv and SiLU (`causal_conv1d_update`), each row's window `state[state_slots[i]]`
    updated in place; -1 is a padding row (its conv columns are zero, its window untouched)."""

    weight: torch.Tensor  # [channels, W] depthwise filter, W in 2..4
    state: torch.Tensor  # [num_slots, W - 1, channels] contiguous, in y's dtype
    state_slots: torch.Tensor  # [M] int64 or int32

    @property
    def channels(self) -> int:
        return self.weight.shape[0]

    @property
    def width(self) -> int:
        return self.weight.shape[1]

    def check(self, op: str, x: torch.Tensor, weight: torch.Tensor, *, swiglu: bool) -> None:
        """Raise unless this conv fits y = x @ weight.T (and no SwiGLU shares the epilogue)."""
        if swiglu:
            raise ValueError(f"{op}: conv and swiglu cannot share an epilogue: pass one of them")
        if self.channels > weight.shape[0]:
            raise ValueError(
                f"{op}: the conv has {self.channels} channels but y has {weight.shape[0]} columns"
            )
        check_conv_weight_state(op, self.channels, x.dtype, self.weight, self.state)
        check_update_inputs(op, self.weight, self.state_slots, x.shape[0])
        check_device(op, {"x": x, "conv weight": self.weight, "conv_state": self.state,
                          "state_slots": self.state_slots})  # fmt: skip
