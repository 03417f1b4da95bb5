"""What one step runs (`ScheduledBatch`) and what the runner hands back (`ModelOutput`)."""

from __future__ import annotations

from dataclasses import dataclass, field

from sparkinfer.scheduler.request import Request, TokenLogprob


@dataclass(frozen=True)
class ScheduledSeq:
    """One request's share of a step: `num_new_tokens` tokens after `num_cached_tokens`.

    Built when the step is scheduled, it keeps the request's length at that moment
    (`num_tokens`, an in-flight sample included), so what it says about the step does not change
    when the request grows later. `is_input_inflight`: its one input token is the previous step's
    sample, still on the device (the runner takes it from there). `num_lookahead_tokens`: KV rows
    reserved after a decode row's token for up to that many draft tokens (speculative decoding;
    the runner verifies as many as its drafter proposes, at most these).
    """

    req: Request
    num_cached_tokens: int
    num_new_tokens: int
    num_lookahead_tokens: int = 0
    num_tokens: int = field(init=False)
    is_input_inflight: bool = field(init=False)

    def __post_init__(self) -> None:
        req = self.req
        object.__setattr__(self, "num_tokens", req.num_tokens + req.num_inflight_tokens)
        object.__setattr__(self, "is_input_inflight", req.num_inflight_tokens > 0)

    @property
    def is_decode(self) -> bool:
        """The request's last generated token goes in and the next one is sampled: the decode
        group of a step, and the only rows a decode CUDA graph replays.

        One new token on a cache is not enough: a prompt chunk cut to a 1-token budget remainder
        looks the same, but it samples nothing (a graph returns a logits row for every row, one
        too many for the sampler), may hold a pad token whose vision row must be merged, and
        sits at its MRoPE prompt position; only tokens past the prompt are at n + rope_delta.
        """
        return (
            self.num_new_tokens == 1
            and self.num_cached_tokens >= self.req.num_prompt_tokens
            and self.is_sampled
        )

    @property
    def is_sampled(self) -> bool:
        """The chunk reaches the last token, so the step samples the next one."""
        return self.num_cached_tokens + self.num_new_tokens == self.num_tokens

    @property
    def output_idx(self) -> int:
        """Index among the request's outputs of the token this step samples."""
        return self.num_tokens - self.req.num_prompt_tokens

    @property
    def num_prompt_logprobs(self) -> int:
        """Rows of this chunk (from its first) whose next token is a prompt token to score.

        Row j sits at position num_cached_tokens + j and predicts the token after it; only a
        request that asked for prompt_logprobs and has not emitted yet wants them (a request
        preempted after its first output recomputes its prompt without scoring it again).
        """
        req = self.req
        if req.params.prompt_logprobs is None or req.num_output_tokens > 0:
            return 0
        return max(0, min(self.num_new_tokens, req.num_prompt_tokens - 1 - self.num_cached_tokens))

    @property
    def new_token_ids(self) -> list[int]:
        """The chunk's input tokens known on the host (an in-flight input is not among them)."""
        start = self.num_cached_tokens
        return self.req.token_ids[start : start + self.num_new_tokens]


@dataclass(frozen=True)
class ScheduledBatch:
    """What one step runs: every scheduled sequence, decodes first.

    `state_copies`: (source, destination) rows of the GDN state pool to copy, in order, before
    the step's forwards: prefix-cache snapshots taken and restored (`prefix_cache`).
    `is_read_at_once`: the runner returns this step's samples in the same call, not overlapped:
    a speculating request's drafter reads its tokens on the host before the next step.
    """

    step_idx: int
    seqs: tuple[ScheduledSeq, ...]
    state_copies: tuple[tuple[int, int], ...] = ()
    is_read_at_once: bool = False  # its samples are read in the same call (speculation drafts)

    @property
    def num_tokens(self) -> int:
        return sum(s.num_new_tokens for s in self.seqs)


@dataclass(frozen=True)
class SampledToken:
    """The token the runner picked for one request, with its logprobs when asked for."""

    token_id: int
    logprob: TokenLogprob | None = None


@dataclass(frozen=True)
class SpecOutcome:
    """One request's verify in a step: drafts proposed and how many of them were accepted
    (the samples then hold num_accepted + 1 tokens for it: the accepted drafts, then the token
    the target drew where the first rejected draft stood, or after the last one)."""

    num_drafts: int
    num_accepted: int


@dataclass(frozen=True)
class ModelOutput:
    """What `Runner.run` returns.

    `samples`: the tokens whose values the host now has, each with the row that sampled it, in
    step order. They are this step's samples, or, when the runner overlaps steps, the previous
    step's (this step's follow at the next call); a step that needs its samples on the host at
    once (a logits processor) brings them in the same call.
    `prompt_logprobs`: per request of this step, the logprobs of its chunk's first
    `num_prompt_logprobs` rows (the prompt tokens at positions num_cached_tokens + 1 onwards).
    `spec`: per request whose row had lookahead tokens this step, what its verify did (absent:
    no drafts were proposed, so it decoded one token).
    """

    samples: tuple[tuple[ScheduledSeq, SampledToken], ...] = ()
    prompt_logprobs: dict[str, tuple[TokenLogprob, ...]] = field(
        default_factory=dict[str, tuple[TokenLogprob, ...]]
    )
    spec: dict[str, SpecOutcome] = field(default_factory=dict[str, SpecOutcome])
