"""`/v1/score` bodies: the logprob of every token of a given completion after a prompt."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, Field, field_validator, model_validator
from sparkinfer.api.schemas.chat import ChatMessage
from sparkinfer.api.schemas.common import MAX_TOP_LOGPROBS, RequestBody, Timings, Usage


class ScoreRequest(RequestBody):
    """`completion` scored after `prompt` (text or ids) or after `messages` (chat template)."""

    model: str | None = Field(
        None, min_length=1, description="served model id; omitted: the one model this server serves"
    )
    prompt: str | list[int] | None = None
    messages: list[ChatMessage] | None = None
    completion: str | list[int]
    top_logprobs: int | None = Field(None, ge=0, le=MAX_TOP_LOGPROBS)
    enable_thinking: bool | None = None
    chat_template_kwargs: dict[str, Any] | None = None

    @field_validator("prompt", "completion")
    @classmethod
    def _check_ids(cls, v: str | list[int] | None) -> str | list[int] | None:
        if isinstance(v, list) and any(t < 0 for t in v):
            raise ValueError("token ids must be >= 0")
        return v

    @model_validator(mode="after")
    def _one_context(self) -> ScoreRequest:
        if (self.prompt is None) == (self.messages is None):
            raise ValueError("give exactly one of prompt or messages")
        if self.messages is not None and not self.messages:
            raise ValueError("messages must not be empty")
        return self


class ScoreResponse(BaseModel):
    """Per completion token: its text, id and logprob given everything before it."""

    id: str
    object: Literal["score"] = "score"
    created: int
    model: str
    tokens: list[str]
    token_ids: list[int]
    token_logprobs: list[float]
    top_logprobs: list[dict[str, float]] | None = None
    logprob: float  # the sum of token_logprobs
    is_greedy: bool  # every completion token was the most likely one
    usage: Usage
    timings: Timings | None = None
