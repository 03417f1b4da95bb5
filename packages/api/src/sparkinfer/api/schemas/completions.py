"""`/v1/completions` bodies: a prompt as text or token ids, responses and chunks."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, Field, field_validator, model_validator
from sparkinfer.api.schemas.common import (
    MAX_COUNT,
    MAX_TOP_LOGPROBS,
    SamplingFields,
    Timings,
    Usage,
    omitted_if_none,
)

MAX_CHOICES = 64  # prompts x n in one request: each is a sequence in the engine
DEFAULT_MAX_TOKENS = 16  # an omitted max_tokens, as in OpenAI's and vLLM's completions


class CompletionRequest(SamplingFields):
    prompt: str | list[int] | list[str] | list[list[int]]
    # 0 with echo: the prompt alone comes back (with its logprobs, if asked for), as scoring
    # clients send it. Omitted: 16 (OpenAI's default); null: up to the context limit (vLLM's).
    max_tokens: int | None = Field(DEFAULT_MAX_TOKENS, ge=0, le=MAX_COUNT)
    logprobs: int | None = Field(None, ge=0, le=MAX_TOP_LOGPROBS)
    echo: bool = False
    suffix: str | None = None

    @field_validator("prompt")
    @classmethod
    def _check_prompt(
        cls, v: str | list[int] | list[str] | list[list[int]]
    ) -> str | list[int] | list[str] | list[list[int]]:
        if isinstance(v, list) and not v:
            raise ValueError("prompt must not be empty")
        if isinstance(v, list) and any(isinstance(p, list) and not p for p in v):
            raise ValueError("a token-id prompt must not be empty")
        if isinstance(v, list) and any(isinstance(t, int) and t < 0 for t in v):
            raise ValueError("token ids must be >= 0")
        return v

    @model_validator(mode="after")
    def _check_counts(self) -> CompletionRequest:
        if self.max_tokens == 0 and not self.echo:
            raise ValueError("max_tokens 0 needs echo true (then the prompt alone is returned)")
        num = len(self.prompts()) * self.n
        if num > MAX_CHOICES:
            raise ValueError(
                f"{len(self.prompts())} prompts x n={self.n} make {num} choices; at most "
                f"{MAX_CHOICES} in one request: split the batch"
            )
        return self

    @field_validator("suffix")
    @classmethod
    def _no_suffix(cls, v: str | None) -> str | None:
        if v:
            raise ValueError("suffix (fill-in-the-middle) is not supported: leave it out")
        return v

    def prompts(self) -> list[str | list[int]]:
        """The batch of prompts: one text or token-id list per entry."""
        p = self.prompt
        if isinstance(p, str):
            return [p]
        if all(isinstance(t, int) for t in p):
            return [list(p)]  # type: ignore[arg-type]
        return list(p)  # type: ignore[arg-type]


class CompletionLogprobs(BaseModel):
    tokens: list[str] = Field(default_factory=list[str])
    token_logprobs: list[float | None] = Field(default_factory=list[float | None])
    top_logprobs: list[dict[str, float] | None] = Field(
        default_factory=list[dict[str, float] | None]
    )
    text_offset: list[int] = Field(default_factory=list[int])


class CompletionChoice(BaseModel):
    index: int
    text: str
    finish_reason: str | None
    logprobs: CompletionLogprobs | None = None


class CompletionResponse(BaseModel):
    id: str
    object: Literal["text_completion"] = "text_completion"
    created: int
    model: str
    choices: list[CompletionChoice]
    usage: Usage | None = omitted_if_none()  # stream chunks: only on the include_usage one
    system_fingerprint: str | None = omitted_if_none()
    timings: Timings | None = omitted_if_none()
