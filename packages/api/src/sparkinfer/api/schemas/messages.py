"""`/v1/messages` (Anthropic Messages) bodies: content blocks, tools, thinking, the message out.

Unknown fields are ignored (clients send `cache_control`, `citations`, betas' fields); known ones
are checked as Anthropic checks them.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal, cast

from pydantic import BaseModel, Field, field_validator
from sparkinfer.api.schemas.common import MAX_COUNT, MAX_STOP_STRINGS, RequestBody


class TextBlock(RequestBody):
    type: Literal["text"]
    text: str


class ImageSource(RequestBody):
    type: str  # base64 is taken; url and file are refused with a 400 naming the field
    media_type: str | None = None
    data: str | None = None
    url: str | None = None


class ImageBlock(RequestBody):
    type: Literal["image"]
    source: ImageSource


class ToolUseBlock(RequestBody):
    type: Literal["tool_use"]
    id: str
    name: str
    input: dict[str, Any]


class ToolResultBlock(RequestBody):
    type: Literal["tool_result"]
    tool_use_id: str
    content: str | list[TextBlock | ImageBlock] | None = None
    is_error: bool = False


class ThinkingBlock(RequestBody):
    type: Literal["thinking"]
    thinking: str
    signature: str | None = None


class RedactedThinkingBlock(RequestBody):
    type: Literal["redacted_thinking"]
    data: str | None = None


Block = Annotated[
    TextBlock | ImageBlock | ToolUseBlock | ToolResultBlock | ThinkingBlock | RedactedThinkingBlock,
    Field(discriminator="type"),
]
_KNOWN_BLOCKS = ("text", "image", "tool_use", "tool_result", "thinking", "redacted_thinking")


class InputMessage(RequestBody):
    role: Literal["user", "assistant", "system"]
    content: str | list[Block]

    @field_validator("content", mode="before")
    @classmethod
    def _check_block_types(cls, v: Any) -> Any:
        """A block type this server does not take (document, server tool results) is named."""
        if not isinstance(v, list):
            return v
        items = cast("list[Any]", v)
        for j, block in enumerate(items):
            kind = cast("dict[str, Any]", block).get("type") if isinstance(block, dict) else None
            if isinstance(kind, str) and kind not in _KNOWN_BLOCKS:
                raise ValueError(
                    f"content[{j}] is a {kind!r} block, which this server does not take; send "
                    f"{', '.join(_KNOWN_BLOCKS)} blocks"
                )
        return items


class ToolDefinition(RequestBody):
    type: str | None = None  # None or "custom": a client tool; server tools are refused
    name: str = Field(pattern=r"^[A-Za-z0-9_.\-]{1,64}$")
    description: str | None = None
    input_schema: dict[str, Any] | None = None


class ToolChoice(RequestBody):
    type: Literal["auto", "any", "tool", "none"]
    name: str | None = None
    disable_parallel_tool_use: bool = False


class ThinkingConfig(RequestBody):
    type: Literal["enabled", "disabled", "adaptive", "between_tools"]
    budget_tokens: int | None = Field(None, ge=1, le=MAX_COUNT)


class OutputFormat(RequestBody):
    type: Literal["json_schema"]
    schema_: dict[str, Any] = Field(alias="schema")


class OutputConfig(RequestBody):
    effort: Literal["low", "medium", "high", "xhigh", "max"] | None = None
    format: OutputFormat | None = None


class Metadata(RequestBody):
    user_id: str | None = None


class CountTokensRequest(RequestBody):
    model: str = Field(min_length=1)
    messages: list[InputMessage] = Field(min_length=1)
    system: str | list[TextBlock] | None = None
    tools: list[ToolDefinition] | None = None
    tool_choice: ToolChoice | None = None
    thinking: ThinkingConfig | None = None
    output_config: OutputConfig | None = None


class MessagesRequest(CountTokensRequest):
    max_tokens: int = Field(ge=1, le=MAX_COUNT)
    stop_sequences: list[str] | None = Field(None, max_length=MAX_STOP_STRINGS)
    temperature: float | None = Field(None, ge=0.0, le=1.0)
    top_p: float | None = Field(None, gt=0.0, le=1.0)
    top_k: int | None = Field(None, ge=0, le=MAX_COUNT)
    metadata: Metadata | None = None
    stream: bool = False

    @field_validator("stop_sequences")
    @classmethod
    def _check_stops(cls, v: list[str] | None) -> list[str] | None:
        if v is not None and any(s == "" for s in v):
            raise ValueError("stop sequences must not be empty")
        return v


class OutTextBlock(BaseModel):
    type: Literal["text"] = "text"
    text: str


class OutThinkingBlock(BaseModel):
    type: Literal["thinking"] = "thinking"
    thinking: str
    signature: str


class OutToolUseBlock(BaseModel):
    type: Literal["tool_use"] = "tool_use"
    id: str
    name: str
    input: dict[str, Any]


OutBlock = OutTextBlock | OutThinkingBlock | OutToolUseBlock
StopReason = Literal[
    "end_turn", "max_tokens", "stop_sequence", "tool_use", "model_context_window_exceeded"
]


class MessagesUsage(BaseModel):
    """Anthropic's counts: input_tokens excludes the tokens read from the prefix cache."""

    input_tokens: int
    output_tokens: int
    cache_creation_input_tokens: int = 0
    cache_read_input_tokens: int = 0


class MessageResponse(BaseModel):
    id: str
    type: Literal["message"] = "message"
    role: Literal["assistant"] = "assistant"
    content: list[OutBlock]
    model: str
    stop_reason: StopReason | None = None
    stop_sequence: str | None = None
    usage: MessagesUsage


class CountTokensResponse(BaseModel):
    input_tokens: int
