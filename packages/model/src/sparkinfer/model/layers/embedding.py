"""Token embedding and the untied LM head with padded-vocabulary masking (docs/model.md §6)."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from sparkinfer.model.layers import KernelOps, new_parameter
from torch import nn


class Embedding(nn.Module):
    """embed_tokens: weight [vocab_size, hidden], no scaling."""

    def __init__(
        self, vocab_size: int, hidden_size: int, *, device: torch.device, dtype: torch.dtype
    ) -> None:
        super().__init__()
        self.weight = new_parameter(vocab_size, hidden_size, device=device, dtype=dtype)

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        """input_ids [T] int64 -> [T, hidden]."""
        return F.embedding(input_ids, self.weight)


class LMHead(nn.Module):
    """lm_head: logits = hidden @ weight.T in fp32, ids >= num_real_tokens set to -inf.

    The checkpoint's vocabulary is padded (248,320 rows for 248,077 real ids); a padded id must
    never be sampled, whatever its row holds. The product runs on `ops.linear` where there is
    one, like every other projection (on the H200 the one-row GEMV streams the 2.5 GB weight
    faster than cuBLAS).
    """

    def __init__(
        self,
        vocab_size: int,
        hidden_size: int,
        *,
        num_real_tokens: int,
        ops: KernelOps,
        device: torch.device,
        dtype: torch.dtype,
    ) -> None:
        super().__init__()
        self.weight = new_parameter(vocab_size, hidden_size, device=device, dtype=dtype)
        self.num_real_tokens = num_real_tokens
        self.ops = ops

    def forward(self, hidden: torch.Tensor, num_ids: int | None = None) -> torch.Tensor:
        """hidden [N, hidden] -> logits [N, vocab_size] fp32, or over the first `num_ids` ids
        only ([N, num_ids]: a contiguous slice of the weight's rows, for drafts)."""
        linear = self.ops.linear if self.ops.linear is not None else F.linear
        weight = self.weight if num_ids is None else self.weight[:num_ids]
        logits = linear(hidden, weight).float()
        if self.num_real_tokens < logits.shape[-1]:
            logits[:, self.num_real_tokens :] = float("-inf")
        return logits
