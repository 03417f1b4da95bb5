"""The layers that differ under tensor parallelism: each ends in the one collective it needs.

Column-parallel projections need no class of their own: a rank's qkv_proj, in_proj and
gate_up_proj are ordinary `Linear`s over its own rows. The projections after them are
row-parallel: each rank multiplies its input columns and one all-reduce sums the partial outputs.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from sparkinfer.kernels.fp8_linear import Fp8Activation
from sparkinfer.model.layers import KernelOps, new_parameter
from sparkinfer.model.layers.linear import Linear
from sparkinfer.model.parallel.group import TensorParallelGroup
from torch import nn


class RowParallelLinear(Linear):
    """o_proj, out_proj, down_proj: this rank's input columns, then an all-reduce of [T, out]."""

    def __init__(
        self,
        in_features: int,
        out_features: int,
        *,
        tp: TensorParallelGroup,
        ops: KernelOps,
        device: torch.device,
        dtype: torch.dtype,
    ) -> None:
        super().__init__(in_features, out_features, ops=ops, device=device, dtype=dtype)
        self.tp = tp

    def forward(self, x: torch.Tensor, x_fp8: Fp8Activation | None = None) -> torch.Tensor:
        """x [T, in_features] (this rank's columns) -> [T, out_features] summed over ranks."""
        return self.tp.all_reduce(super().forward(x, x_fp8))


class VocabParallelEmbedding(nn.Module):
    """embed_tokens over this rank's vocabulary rows; ids outside them give zeros, and one
    all-reduce assembles each row from the rank that owns its id."""

    def __init__(
        self,
        vocab: range,
        shard_len: int,
        hidden_size: int,
        *,
        tp: TensorParallelGroup,
        device: torch.device,
        dtype: torch.dtype,
    ) -> None:
        super().__init__()
        self.vocab_start, self.vocab_end = vocab.start, vocab.stop
        # [shard_len, hidden]: rows past the vocabulary (the last shard's tail) stay zero.
        self.weight = new_parameter(shard_len, hidden_size, device=device, dtype=dtype)
        self.weight.data.zero_()
        self.tp = tp

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        """input_ids [T] int64 -> [T, hidden]."""
        is_mine = (input_ids >= self.vocab_start) & (input_ids < self.vocab_end)
        local = torch.where(is_mine, input_ids - self.vocab_start, 0)
        h = F.embedding(local, self.weight) * is_mine.unsqueeze(-1).to(self.weight.dtype)
        return self.tp.all_reduce(h)


class VocabParallelLMHead(nn.Module):
    """lm_head over this rank's vocabulary rows; an all-gather gives every rank all logits."""

    def __init__(
        self,
        vocab_size: int,
        shard_len: int,
        hidden_size: int,
        *,
        num_real_tokens: int,
        tp: TensorParallelGroup,
        ops: KernelOps,
        device: torch.device,
        dtype: torch.dtype,
    ) -> None:
        super().__init__()
        self.weight = new_parameter(shard_len, hidden_size, device=device, dtype=dtype)
        self.weight.data.zero_()
        self.vocab_size, self.num_real_tokens = vocab_size, num_real_tokens
        self.ops, self.tp = ops, tp

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        """hidden [N, hidden] -> logits [N, vocab_size] fp32, padded ids set to -inf."""
        linear = self.ops.linear if self.ops.linear is not None else F.linear
        local = linear(hidden, self.weight).float()  # [N, shard_len]
        logits = self.tp.all_gather_last_dim(local)[:, : self.vocab_size]
        if self.num_real_tokens < self.vocab_size:
            logits[:, self.num_real_tokens :] = float("-inf")
        return logits
