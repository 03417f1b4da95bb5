"""The part of the model the runner calls: `Qwen3_8ForCausalLM`, or a fake in tests."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Protocol, runtime_checkable

import torch
from sparkinfer.model.cache_spec import CacheSpec, ModelCaches
from sparkinfer.model.decoder import TappedOutput
from sparkinfer.model.forward_batch import ForwardBatch, VerifyLayout


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

    def commit_verify(
        self, caches: ModelCaches, verify: VerifyLayout, num_kept: torch.Tensor
    ) -> None: ...

    def parameters(self, recurse: bool = True) -> Iterator[torch.nn.Parameter]: ...


@runtime_checkable
class TappedCausalLM(CausalLM, Protocol):
    """A model whose forward also returns a few layers' hidden states (a block drafter's taps)."""

    def forward_tapped(
        self,
        input_ids: torch.Tensor,
        batch: ForwardBatch,
        *,
        inputs_embeds: torch.Tensor | None = None,
        logits_rows_only: bool = False,
    ) -> TappedOutput: ...


def forward_tapped(
    model: CausalLM,
    input_ids: torch.Tensor,
    batch: ForwardBatch,
    *,
    inputs_embeds: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """model's forward over every row -> (final hidden [T, hidden], tapped [T, taps * hidden])."""
    if not isinstance(model, TappedCausalLM):
        raise TypeError(
            f"{type(model).__name__} has no forward_tapped: a block drafter needs a model that "
            "returns its tap layers' hidden states (Qwen3_8ForCausalLM)"
        )
    out = model.forward_tapped(input_ids, batch, inputs_embeds=inputs_embeds)
    return out.hidden, out.tapped
