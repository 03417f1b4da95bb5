"""`/v1/responses` (OpenAI Responses) bodies: input items, function tools, the response object.

Input items stay plain JSON objects here (checked item by item in `responses_input`, which
names the bad one), since they are also what is stored for `previous_response_id`.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, Field, StringConstraints
from sparkinfer.api.schemas.chat import ReasoningEffort
from sparkinfer.api.schemas.common import MAX_COUNT, MAX_TOP_LOGPROBS, RequestBody

# OpenAI's limits: 16 metadata pairs, keys up to 64 characters, values up to 512; `user` as its
# successor `safety_identifier` (64); ids as this server makes them, with room to spare.
MAX_METADATA_PAIRS = 16
MAX_USER_LEN = 64
MAX_RESPONSE_ID_LEN = 128
Metadata = Annotated[
    dict[
        Annotated[str, StringConstraints(max_length=64)],
        Annotated[str, StringConstraints(max_length=512)],
    ],
    Field(max_length=MAX_METADATA_PAIRS),
]


class FunctionTool(RequestBody):
    """A function tool, a namespace of them, or a hosted tool (left out: the server runs none)."""

    type: str
    name: str | None = None
    description: str | None = None
    parameters: dict[str, Any] | None = None
    strict: bool | None = None
    tools: list[FunctionTool] | None = None  # a namespace's tools


class FunctionChoice(RequestBody):
    type: Literal["function"]
    name: str


class Reasoning(RequestBody):
    effort: ReasoningEffort | None = None
    summary: str | None = None
    max_tokens: int | None = Field(None, ge=1, le=MAX_COUNT)  # reasoning budget (an extension)


class TextFormat(RequestBody):
    type: Literal["text", "json_object", "json_schema"]
    name: str | None = None
    schema_: dict[str, Any] | None = Field(None, alias="schema")
    description: str | None = None
    strict: bool | None = None


class TextConfig(RequestBody):
    format: TextFormat | None = None


class ResponsesRequest(RequestBody):
    model: str | None = Field(None, min_length=1)
    input: str | list[dict[str, Any]] = Field(min_length=1)
    instructions: str | None = None
    tools: list[FunctionTool] | None = None
    tool_choice: Literal["none", "auto", "required"] | FunctionChoice | None = None
    parallel_tool_calls: bool = True
    reasoning: Reasoning | None = None
    text: TextConfig | None = None
    max_output_tokens: int | None = Field(None, ge=1, le=MAX_COUNT)
    temperature: float | None = Field(None, ge=0.0, le=2.0)
    top_p: float | None = Field(None, gt=0.0, le=1.0)
    top_k: int | None = Field(None, ge=-1, le=MAX_COUNT)
    stream: bool = False
    store: bool = True
    previous_response_id: str | None = Field(None, max_length=MAX_RESPONSE_ID_LEN)
    metadata: Metadata | None = None
    user: str | None = Field(None, max_length=MAX_USER_LEN)
    background: bool = False
    conversation: Any = None
    include: list[str] | None = None  # "message.output_text.logprobs": the answer's logprobs
    top_logprobs: int | None = Field(None, ge=0, le=MAX_TOP_LOGPROBS)


class InputTokensDetails(BaseModel):
    cached_tokens: int = 0


class OutputTokensDetails(BaseModel):
    reasoning_tokens: int = 0


class ResponseUsage(BaseModel):
    input_tokens: int
    input_tokens_details: InputTokensDetails
    output_tokens: int
    output_tokens_details: OutputTokensDetails
    total_tokens: int


class IncompleteDetails(BaseModel):
    reason: Literal["max_output_tokens"]


class ResponseObject(BaseModel):
    """The response, as returned, streamed in lifecycle events, stored and retrieved."""

    id: str
    object: Literal["response"] = "response"
    created_at: int
    status: Literal["in_progress", "completed", "incomplete", "failed"]
    error: dict[str, Any] | None = None
    incomplete_details: IncompleteDetails | None = None
    instructions: str | None = None
    max_output_tokens: int | None = None
    model: str
    output: list[dict[str, Any]] = Field(default_factory=list[dict[str, Any]])
    parallel_tool_calls: bool = True
    previous_response_id: str | None = None
    reasoning: dict[str, Any] | None = None
    store: bool = True
    temperature: float | None = None
    text: dict[str, Any] = Field(default_factory=lambda: {"format": {"type": "text"}})
    tool_choice: Any = "auto"
    tools: list[dict[str, Any]] = Field(default_factory=list[dict[str, Any]])
    top_p: float | None = None
    truncation: Literal["disabled"] = "disabled"
    usage: ResponseUsage | None = None
    user: str | None = None
    metadata: dict[str, str] = Field(default_factory=dict[str, str])


class DeletedResponse(BaseModel):
    id: str
    object: Literal["response.deleted"] = "response.deleted"
    deleted: bool = True


class InputItemList(BaseModel):
    object: Literal["list"] = "list"
    data: list[dict[str, Any]]
    first_id: str | None = None
    last_id: str | None = None
    has_more: bool = False
