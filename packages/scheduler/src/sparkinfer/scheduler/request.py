"""A request's public parameters and outputs, and the `Request` that owns its engine state."""

from __future__ import annotations

import enum
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # annotations only: the scheduler's bookkeeping runs without torch
    import torch

_MIN_SAMPLING_TEMPERATURE = 1e-5  # below it, sampling is greedy (vLLM's _SAMPLING_EPS)


@dataclass(frozen=True)
class SamplingParams:
    """How to pick each next token and when to stop (validated by the API before it gets here).

    max_tokens None means "up to the context limit". temperature below 1e-5 (0 included) means
    greedy, as in vLLM: dividing logits by a tinier one overflows to inf and NaN probabilities.
    top_k 0 or -1 and top_p 1.0 disable those filters. logprobs None: no logprobs; k: the chosen
    token's logprob plus the k most likely. prompt_logprobs None: none; k: the same for every
    prompt token after the first, given the tokens before it (as vLLM's prompt_logprobs).
    """

    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    min_p: float = 0.0
    seed: int | None = None
    max_tokens: int | None = None
    min_tokens: int = 0
    stop_token_ids: tuple[int, ...] = ()
    ignore_eos: bool = False
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    repetition_penalty: float = 1.0
    logit_bias: tuple[tuple[int, float], ...] = ()
    logprobs: int | None = None
    prompt_logprobs: int | None = None
    # Called in the engine thread as logits_processor(output_token_ids, logits_row [vocab] fp32)
    # right before the draw; it edits the row in place (e.g. a grammar's token mask).
    logits_processor: Callable[[Sequence[int], Any], object] | None = field(
        default=None, compare=False, repr=False
    )

    def __post_init__(self) -> None:
        if self.temperature < 0:
            raise ValueError(f"temperature is {self.temperature}; it must be >= 0")
        if not 0.0 < self.top_p <= 1.0:
            raise ValueError(f"top_p is {self.top_p}; it must be in (0, 1]")
        if self.max_tokens is not None and self.max_tokens < 1:
            raise ValueError(f"max_tokens is {self.max_tokens}; it must be >= 1")
        if self.repetition_penalty <= 0:
            raise ValueError(f"repetition_penalty is {self.repetition_penalty}; it must be > 0")
        if self.prompt_logprobs is not None and self.prompt_logprobs < 0:
            raise ValueError(f"prompt_logprobs is {self.prompt_logprobs}; it must be >= 0")

    @property
    def is_greedy(self) -> bool:
        return self.temperature < _MIN_SAMPLING_TEMPERATURE or self.top_k == 1


@dataclass(frozen=True, eq=False)
class MultimodalInputs:
    """The images and videos of one prompt, preprocessed at the edge (host tensors).

    pixel_values: [N, patch_dim] float32 patch vectors of every item, concatenated in prompt order
    grid_thw:     (t, h, w) in patches of each item, in prompt order; item i fills the next
                  t * h * w / merge**2 image or video pad tokens of the prompt
    kinds:        "image" or "video" for each item
    positions:    [3, num_prompt_tokens] int64 MRoPE (t, h, w) positions of the prompt; None: plain
                  sequential positions for every token (MRoPE off)
    rope_delta:   the token at cache index n >= num_prompt_tokens has position n + rope_delta on
                  all three axes (0 without MRoPE)
    content_hashes: one hash per item of what the tower sees (media bytes and processor settings);
                  empty: the items are not reused (no tower-output cache, no prefix cache)
    pad_runs:     (start, end, item index) of each run of pad tokens in the prompt, in order; with
                  content_hashes, the prefix cache keys these runs by their item's hash
    """

    pixel_values: torch.Tensor
    grid_thw: tuple[tuple[int, int, int], ...]
    kinds: tuple[str, ...]
    positions: torch.Tensor | None = None
    rope_delta: int = 0
    content_hashes: tuple[str, ...] = ()
    pad_runs: tuple[tuple[int, int, int], ...] = ()

    def __post_init__(self) -> None:
        if self.content_hashes and len(self.content_hashes) != len(self.grid_thw):
            raise ValueError(
                f"multimodal inputs have {len(self.content_hashes)} content hashes for "
                f"{len(self.grid_thw)} items; give one hash per item, or none"
            )
        if len(self.kinds) != len(self.grid_thw) or not self.grid_thw:
            raise ValueError(
                f"multimodal inputs have {len(self.grid_thw)} grids and {len(self.kinds)} kinds; "
                "give one grid and one kind (image or video) per item, at least one item"
            )
        if any(k not in ("image", "video") for k in self.kinds):
            raise ValueError(f"multimodal kinds are {self.kinds}; each must be image or video")
        num_patches = sum(t * h * w for t, h, w in self.grid_thw)
        if self.pixel_values.dim() != 2 or self.pixel_values.shape[0] != num_patches:
            raise ValueError(
                f"pixel_values has shape {tuple(self.pixel_values.shape)}; grid_thw "
                f"{list(self.grid_thw)} needs {num_patches} rows"
            )

    def num_pad_tokens(self, merge_size: int) -> int:
        """Pad tokens the items fill in the prompt (the vision tower's output rows)."""
        return sum(t * (h // merge_size) * (w // merge_size) for t, h, w in self.grid_thw)


class FinishReason(enum.StrEnum):
    STOP = "stop"  # a stop token id (EOS or user-given)
    LENGTH = "length"  # max_tokens or the context limit
    ABORT = "abort"  # client gone or aborted
    ERROR = "error"  # the engine failed this request


@dataclass(frozen=True)
class TokenLogprob:
    """The chosen token's logprob and the top alternatives at that step."""

    token_id: int
    logprob: float
    top: tuple[tuple[int, float], ...] = ()


@dataclass(frozen=True)
class RequestMetrics:
    """Engine telemetry of one request (not billing figures)."""

    ttft_ms: float | None = None
    generation_ms: float | None = None
    decode_tps: float | None = None
    num_draft_tokens: int = 0  # speculative decoding: drafts verified, and accepted
    num_accepted_tokens: int = 0


@dataclass(frozen=True)
class RequestOutput:
    """What one engine step produced for one request: new tokens, and how it ended if it did.

    `prompt_logprobs` (asked for with SamplingParams.prompt_logprobs) comes on the first output
    only: entry i is prompt token i + 1 given tokens 0..i; the first prompt token has none.
    """

    request_id: str
    new_token_ids: tuple[int, ...]
    num_prompt_tokens: int
    num_output_tokens: int
    num_cached_tokens: int = 0
    finish_reason: FinishReason | None = None
    error: str | None = None
    logprobs: tuple[TokenLogprob, ...] = ()
    prompt_logprobs: tuple[TokenLogprob, ...] = ()
    metrics: RequestMetrics = field(default_factory=RequestMetrics)

    @property
    def is_finished(self) -> bool:
        return self.finish_reason is not None


PRIOR_ACCEPTED, PRIOR_REJECTED = 1.0, 1.0  # a draft's acceptance is 0.5 before any verify
FIRST_COOLDOWN_STEPS = 16  # a request's first cool-down; each after it doubles


@dataclass
class RequestSpec:
    """One request's speculation: its verify counts and acceptance (`speculative.policy`)."""

    num_verifies: int = 0
    num_draft_tokens: int = 0
    num_accepted_tokens: int = 0
    accepted_weight: float = PRIOR_ACCEPTED
    rejected_weight: float = PRIOR_REJECTED
    cooldown_steps: int = 0
    next_cooldown: int = FIRST_COOLDOWN_STEPS
    is_probing: bool = False  # its next verify is the first after a cool-down
    is_new: bool = True  # not yet planned by the policy (`SpecPolicy.plan_step`)

    @property
    def acceptance(self) -> float:
        return self.accepted_weight / (self.accepted_weight + self.rejected_weight)

    def expected_tokens(self, num_drafts: int) -> float:
        a = self.acceptance
        return sum(a**j for j in range(num_drafts + 1))


class RequestStatus(enum.Enum):
    WAITING = "waiting"  # queued, or preempted and queued again at the front
    RUNNING = "running"  # holds KV blocks and a state slot
    FINISHED = "finished"


OutputCallback = Callable[[RequestOutput], None]


class Request:
    """One request inside the engine: its tokens, media, status, sampling params, block table and
    slot.

    `token_ids` holds prompt then generated tokens. `num_computed_tokens` of them are in the KV
    cache and the recurrent state. `num_inflight_tokens` more were sampled on the device by a step
    whose results the host has not read yet (the runner overlaps one step with the next); they
    join `token_ids` when that step is resolved. The scheduler owns every change to this object.
    """

    def __init__(
        self,
        request_id: str,
        prompt_token_ids: Sequence[int],
        params: SamplingParams,
        *,
        max_len: int,
        on_output: OutputCallback | None = None,
        arrival_time: float | None = None,
        multimodal: MultimodalInputs | None = None,
    ) -> None:
        self.request_id = request_id
        self.multimodal = multimodal
        self.params = params
        self.token_ids: list[int] = list(prompt_token_ids)
        self.num_prompt_tokens = len(self.token_ids)
        self.max_len = max_len  # finish with LENGTH once token_ids reaches this
        self.on_output = on_output
        self.status = RequestStatus.WAITING
        self.num_computed_tokens = 0
        self.num_inflight_tokens = 0
        self.block_ids: list[int] = []
        self.state_slot: int | None = None
        self.num_cached_prompt_tokens = 0  # served from the prefix cache at the last admission
        # Where prefill chunks end so the prefix is cached (`prefix_cache`), ascending; the
        # chained digests of the tokens' aligned pieces, extended as they grow; the cached prefix
        # last checked against the tokens.
        self.checkpoints: list[int] = []
        self.prefix_digests: list[int] = []
        self.prefix_confirmed: object | None = None
        self.num_preemptions = 0
        self.finish_reason: FinishReason | None = None
        self.error: str | None = None
        self.prompt_logprobs: list[TokenLogprob] = []  # gathered chunk by chunk until emitted
        self.spec = RequestSpec()  # speculative decoding's counts and acceptance
        self.arrival_time = time.monotonic() if arrival_time is None else arrival_time
        self.first_token_time: float | None = None
        self.finish_time: float | None = None

    @property
    def num_tokens(self) -> int:
        return len(self.token_ids)

    @property
    def rope_delta(self) -> int:
        """Offset of positions after the prompt: token n is at n + rope_delta (0 for text)."""
        return 0 if self.multimodal is None else self.multimodal.rope_delta

    @property
    def num_output_tokens(self) -> int:
        return len(self.token_ids) - self.num_prompt_tokens

    @property
    def output_token_ids(self) -> list[int]:
        return self.token_ids[self.num_prompt_tokens :]

    @property
    def num_pending_tokens(self) -> int:
        """Tokens not in the cache yet: the prompt (all, after preemption), or the last sample
        (known, or still in flight on the device)."""
        return self.num_tokens + self.num_inflight_tokens - self.num_computed_tokens

    @property
    def is_at_max_len(self) -> bool:
        """Every token it may hold is known or in flight: it finishes once they are resolved."""
        return self.num_tokens + self.num_inflight_tokens >= self.max_len

    @property
    def is_finished(self) -> bool:
        return self.status is RequestStatus.FINISHED

    def metrics(self) -> RequestMetrics:
        """Telemetry so far: time to first token, decode time and decode tokens per second."""
        spec = {
            "num_draft_tokens": self.spec.num_draft_tokens,
            "num_accepted_tokens": self.spec.num_accepted_tokens,
        }
        if self.first_token_time is None:
            return RequestMetrics(**spec)
        ttft_ms = (self.first_token_time - self.arrival_time) * 1e3
        if self.finish_time is None:
            return RequestMetrics(ttft_ms=ttft_ms, **spec)
        generation_s = self.finish_time - self.first_token_time
        decode_tps = (self.num_output_tokens - 1) / generation_s if generation_s > 0 else None
        return RequestMetrics(
            ttft_ms=ttft_ms, generation_ms=generation_s * 1e3, decode_tps=decode_tps, **spec
        )
