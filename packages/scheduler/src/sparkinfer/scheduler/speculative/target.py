"""What a speculative step needs of the target's runner: its public face, as a protocol, so the
speculative code depends on no runner module (the runner satisfies it structurally)."""

from __future__ import annotations

from contextlib import AbstractContextManager
from typing import Protocol

import torch
from sparkinfer.model.cache_spec import ModelCaches
from sparkinfer.scheduler._causal_lm import CausalLM
from sparkinfer.scheduler._inflight import StepInFlight
from sparkinfer.scheduler.batch import ScheduledBatch, ScheduledSeq
from sparkinfer.scheduler.config import SchedulerConfig
from sparkinfer.scheduler.graphs.decode import DecodeGraphs
from sparkinfer.scheduler.graphs.verify import VerifyGraphs
from sparkinfer.scheduler.request import TokenLogprob
from sparkinfer.scheduler.sampler import Sampler


class Target(Protocol):
    """The target model's runner as a speculative step drives it."""

    @property
    def model(self) -> CausalLM: ...
    @property
    def config(self) -> SchedulerConfig: ...
    @property
    def device(self) -> torch.device: ...
    @property
    def caches(self) -> ModelCaches: ...
    @property
    def sampler(self) -> Sampler: ...
    @property
    def vocab_size(self) -> int: ...
    @property
    def graphs(self) -> DecodeGraphs | None: ...
    @property
    def verify_graphs(self) -> VerifyGraphs | None: ...

    def on_stream(self) -> AbstractContextManager[None]: ...
    def numerics(self, *, is_decode: bool) -> AbstractContextManager[None]: ...
    def prepare_step(self, batch: ScheduledBatch) -> None: ...

    def forward(
        self,
        seqs: list[ScheduledSeq],
        prompt_logprobs: dict[str, tuple[TokenLogprob, ...]],
        inflight: StepInFlight | None,
    ) -> torch.Tensor: ...

    def forward_eager(
        self,
        seqs: list[ScheduledSeq],
        prompt_logprobs: dict[str, tuple[TokenLogprob, ...]],
        inflight: StepInFlight | None,
        *,
        all_rows: bool,
        use_taps: bool = False,
    ) -> tuple[torch.Tensor, torch.Tensor]: ...
