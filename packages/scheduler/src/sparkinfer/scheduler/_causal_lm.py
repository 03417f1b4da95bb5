"""The part of the model the runner calls: `Qwen3_8ForCausalLM`, or a fake in tests."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Protocol

import torch
from sparkinfer.model.cache_spec import CacheSpec
from sparkinfer.model.forward_batch import ForwardBatch


class CausalLM(Protocol):
    """Structural type of the model: docs/contracts.md, "Model ↔ engine"."""

    def __call__(
        self,
        input_ids: torch.Tensor,
        batch: ForwardBatch,
        *,
        inputs_embeds: torch.Tensor | None = None,
        logits_rows_only: bool = False,
    ) -> torch.Tensor: ...

    def cache_spec(self) -> CacheSpec: ...

    def kernel_warmup_lengths(self, max_tokens: int) -> tuple[int, ...]: ...

    def embed_input_ids(self, input_ids: torch.Tensor) -> torch.Tensor: ...

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor: ...

    def parameters(self, recurse: bool = True) -> Iterator[torch.nn.Parameter]: ...
