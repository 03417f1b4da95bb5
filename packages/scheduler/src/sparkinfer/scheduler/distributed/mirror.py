"""Rank 0's side of tensor parallel: each forward, logits product and state copy is sent to the
other ranks, then run on rank 0's own shard.

The scheduler runs once, on rank 0; the other ranks hold no requests. They execute the same
step plan: rank 0's runner calls the model exactly as it would at size 1, and `MirroredModel`
broadcasts each call's inputs (`step_plan`) just before running it, so every rank runs the same
forwards in the same order and meets the same collectives. At size 1 none of this exists: the
runner holds the plain model.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator, Sequence

import torch
from sparkinfer.model.cache_spec import CacheSpec, ModelCaches
from sparkinfer.model.decoder import Qwen3_8ForCausalLM
from sparkinfer.model.forward_batch import ForwardBatch, VerifyLayout
from sparkinfer.scheduler.batch import ModelOutput, ScheduledBatch
from sparkinfer.scheduler.config import SchedulerConfig
from sparkinfer.scheduler.distributed.channel import StepChannel
from sparkinfer.scheduler.distributed.step_plan import cache_key, encode_forward
from sparkinfer.scheduler.runner import Runner

logger = logging.getLogger(__name__)


class MirroredModel:
    """The `CausalLM` rank 0's runner holds: its shard, with every call mirrored to the ranks."""

    def __init__(self, shard: Qwen3_8ForCausalLM, channel: StepChannel) -> None:
        self.shard = shard
        self.channel = channel
        self.config = shard.config
        self._last_hidden: torch.Tensor | None = None  # the forward output every rank holds

    def __call__(
        self,
        input_ids: torch.Tensor,
        batch: ForwardBatch,
        *,
        inputs_embeds: torch.Tensor | None = None,
        logits_rows_only: bool = False,
    ) -> torch.Tensor:
        if inputs_embeds is not None:
            raise NotImplementedError("image and video input does not run under tensor parallel")
        meta, packed = encode_forward(input_ids, batch, logits_rows_only=logits_rows_only)
        self.channel.send("forward", meta, packed)
        hidden = self.shard(input_ids, batch, logits_rows_only=logits_rows_only)
        self._last_hidden = hidden
        return hidden

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """The all-gathered logits; the ranks reuse their own forward output when `hidden` is
        rank 0's (the sampling path), else they receive these rows."""
        if hidden is self._last_hidden:
            self.channel.send("logits_of_forward", {})
        else:
            self.channel.send("logits", {}, hidden)
        return self.shard.compute_logits(hidden)

    def copy_states(self, key: tuple[int, int, int], copies: Sequence[tuple[int, int]]) -> None:
        """Tell the ranks to copy these state rows (the runner copies rank 0's own)."""
        if copies:
            self.channel.send("copy_states", {"cache_key": key, "copies": list(copies)})

    def commit_verify(
        self, caches: ModelCaches, verify: VerifyLayout, num_kept: torch.Tensor
    ) -> None:
        raise NotImplementedError("speculative verify steps do not run under tensor parallel")

    def cache_spec(self) -> CacheSpec:
        return self.shard.cache_spec()

    def kernel_warmup_lengths(self, max_tokens: int) -> tuple[int, ...]:
        return self.shard.kernel_warmup_lengths(max_tokens)

    def embed_input_ids(self, input_ids: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError("image and video input does not run under tensor parallel")

    def parameters(self, recurse: bool = True) -> Iterator[torch.nn.Parameter]:
        return self.shard.parameters(recurse)


class TensorParallelRunner(Runner):
    """The runner of rank 0: the ordinary runner over a `MirroredModel`, with state copies
    mirrored, and a step refused once a rank has gone (`fail`).

    CUDA graphs are off for now (`enforce_eager`): the other ranks would have to replay the same
    graph in step (a "replay" message naming the graph); the collectives in the forward are
    plain torch.distributed calls that a capture records.
    """

    def __init__(
        self,
        model: MirroredModel,
        config: SchedulerConfig,
        *,
        device: torch.device,
        on_close: Callable[[], None],
    ) -> None:
        self._failure: str | None = None
        self._on_close = on_close
        self.mirrored = model
        super().__init__(model, config, device=device)

    def fail(self, reason: str) -> None:
        """A rank has exited: every later step raises `reason`."""
        self._failure = reason

    def run(self, batch: ScheduledBatch) -> ModelOutput:
        if self._failure is not None:
            raise RuntimeError(self._failure)
        return super().run(batch)

    def copy_states(self, copies: Sequence[tuple[int, int]]) -> None:
        self.mirrored.copy_states(cache_key(self.caches), copies)
        super().copy_states(copies)

    def close(self) -> None:
        super().close()
        if self._failure is None:
            try:
                self.mirrored.channel.send("stop", {})
            except Exception:  # a rank gone while stopping: the watchdog reports it
                logger.exception("could not tell the tensor-parallel ranks to stop")
        self._on_close()
