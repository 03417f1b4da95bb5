"""`/v1/score` bodies: the log-probability of each continuation given a prompt."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, Field
from sparkinfer.api.schemas.common import RequestBody, Usage


class ScoreRequest(RequestBody):
    """Score `continuations` after `prompt` (texts): sum of the continuation tokens' logprobs."""

    model: str = Field(min_length=1)
    prompt: str
    continuations: list[str] = Field(min_length=1, max_length=64)


class ScoreItem(BaseModel):
    index: int
    continuation: str
    logprob: float
    num_tokens: int
    token_logprobs: list[float]


class ScoreResponse(BaseModel):
    id: str
    object: Literal["score"] = "score"
    model: str
    data: list[ScoreItem]
    usage: Usage
