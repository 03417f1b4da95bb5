"""`/v1/chat/completions` bodies: messages, tools, reasoning controls, responses and chunks."""

from __future__ import annotations

import json
from typing import Any, Literal, cast

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationInfo,
    field_validator,
    model_validator,
)
from sparkinfer.api.json_body import MAX_JSON_DEPTH, JsonLimitError, check_json_value
from sparkinfer.api.schemas.common import (
    MAX_COUNT,
    MAX_TOP_LOGPROBS,
    ChatLogprobs,
    RequestBody,
    SamplingFields,
    Timings,
    Usage,
    omitted_if_none,
)

REASONING_EFFORTS = ("none", "minimal", "low", "medium", "high", "xhigh", "max")
ReasoningEffort = Literal["none", "minimal", "low", "medium", "high", "xhigh", "max"]


class ContentPart(RequestBody):
    """One part of a list content: text, image_url or video_url (other keys kept as given)."""

    model_config = ConfigDict(extra="allow")
    type: str
    text: str | None = None


class FunctionCall(RequestBody):
    name: str
    arguments: str | dict[str, Any]

    @field_validator("arguments")
    @classmethod
    def _check_nesting(cls, v: str | dict[str, Any]) -> str | dict[str, Any]:
        """JSON text is checked as the body is: the template parses and re-dumps it."""
        if not isinstance(v, str):
            return v
        try:
            check_json_value(json.loads(v))
        except RecursionError:
            raise ValueError(f"is nested deeper than {MAX_JSON_DEPTH} levels: flatten it") from None
        except JsonLimitError as exc:
            raise ValueError(str(exc).removeprefix(exc.param).strip()) from None
        except ValueError:  # not JSON: the template says so, naming the field
            pass
        return v


class ToolCall(RequestBody):
    id: str | None = None
    type: Literal["function"] = "function"
    function: FunctionCall


class ChatMessage(RequestBody):
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[ContentPart] | None = None
    name: str | None = None
    tool_calls: list[ToolCall] | None = None
    tool_call_id: str | None = None
    reasoning_content: str | None = None
    reasoning: str | None = None


class FunctionDefinition(RequestBody):
    name: str = Field(pattern=r"^[A-Za-z0-9_.\-]{1,64}$")
    description: str | None = None
    parameters: dict[str, Any] | None = None
    strict: bool | None = None


class Tool(RequestBody):
    type: Literal["function"]
    function: FunctionDefinition


class NamedFunction(RequestBody):
    name: str


class NamedToolChoice(RequestBody):
    type: Literal["function"]
    function: NamedFunction


class JsonSchemaFormat(RequestBody):
    name: str = "response"
    description: str | None = None
    schema_: dict[str, Any] | None = Field(None, alias="schema")
    strict: bool | None = None


class ResponseFormat(RequestBody):
    type: Literal["text", "json_object", "json_schema"]
    json_schema: JsonSchemaFormat | None = None

    @model_validator(mode="after")
    def _needs_schema(self) -> ResponseFormat:
        if self.type == "json_schema" and self.json_schema is None:
            raise ValueError("type json_schema needs a json_schema object with a schema")
        return self


class ReasoningConfig(RequestBody):
    """OpenRouter-style reasoning controls."""

    enabled: bool | None = None
    effort: ReasoningEffort | None = None
    max_tokens: int | None = Field(None, ge=1, le=MAX_COUNT)
    exclude: bool = False


def _legacy_message(message: Any) -> Any:
    """A legacy `function` message as a tool message, an assistant's `function_call` as its
    one tool call."""
    if not isinstance(message, dict):
        return message
    m = dict(cast("dict[str, Any]", message))
    if m.get("role") == "function":
        m["role"] = "tool"
    call = m.pop("function_call", None)
    if call is not None and m.get("tool_calls") is None:
        m["tool_calls"] = [{"id": "call_0", "type": "function", "function": call}]
    return m


class ChatCompletionRequest(SamplingFields):
    messages: list[ChatMessage] = Field(min_length=1)
    max_completion_tokens: int | None = Field(None, ge=1, le=MAX_COUNT)
    logprobs: bool = False
    top_logprobs: int | None = Field(None, ge=0, le=MAX_TOP_LOGPROBS)
    tools: list[Tool] | None = None
    tool_choice: Literal["none", "auto", "required"] | NamedToolChoice | None = None
    parallel_tool_calls: bool = True
    response_format: ResponseFormat | None = None
    reasoning_effort: ReasoningEffort | None = None
    reasoning: ReasoningConfig | None = None
    enable_thinking: bool | None = None
    chat_template_kwargs: dict[str, Any] | None = None
    # vLLM's: the final assistant message is continued (prefill), not closed.
    continue_final_message: bool = False

    @model_validator(mode="before")
    @classmethod
    def _legacy_functions(cls, data: Any) -> Any:
        """OpenAI's deprecated `functions` / `function_call` fields and `function` role, as the
        tools, tool_choice and tool messages they became."""
        if not isinstance(data, dict):
            return data
        body = dict(cast("dict[str, Any]", data))
        functions = body.pop("functions", None)
        choice = body.pop("function_call", None)
        if isinstance(functions, list) and body.get("tools") is None:
            items = cast("list[Any]", functions)
            body["tools"] = [{"type": "function", "function": f} for f in items]
        if choice is not None and body.get("tool_choice") is None:
            body["tool_choice"] = (
                {"type": "function", "function": choice} if isinstance(choice, dict) else choice
            )
        if isinstance(body.get("messages"), list):
            body["messages"] = [_legacy_message(m) for m in body["messages"]]
        return body

    @field_validator("continue_final_message")
    @classmethod
    def _check_continued(cls, v: bool, info: ValidationInfo) -> bool:
        messages = info.data.get("messages")
        if v and messages and messages[-1].role != "assistant":
            raise ValueError("needs a final assistant message to continue")
        return v

    @model_validator(mode="after")
    def _check_combinations(self) -> ChatCompletionRequest:
        if self.top_logprobs and not self.logprobs:
            raise ValueError("top_logprobs needs logprobs=true")
        forced = isinstance(self.tool_choice, NamedToolChoice) or self.tool_choice == "required"
        if forced and not self.tools:
            raise ValueError(f"tool_choice {self.tool_choice!r} needs a non-empty tools list")
        return self

    @property
    def output_limit(self) -> int | None:
        """max_completion_tokens, else max_tokens (None: up to the context limit)."""
        return self.max_completion_tokens or self.max_tokens


class ToolCallFunction(BaseModel):
    name: str
    arguments: str


class ResponseToolCall(BaseModel):
    id: str
    type: Literal["function"] = "function"
    function: ToolCallFunction


class ResponseMessage(BaseModel):
    role: Literal["assistant"] = "assistant"
    content: str | None = None
    reasoning_content: str | None = None
    reasoning: str | None = None
    tool_calls: list[ResponseToolCall] | None = None


class ChatChoice(BaseModel):
    index: int
    message: ResponseMessage
    finish_reason: str | None
    logprobs: ChatLogprobs | None = None


class ChatCompletionResponse(BaseModel):
    id: str
    object: Literal["chat.completion"] = "chat.completion"
    created: int
    model: str
    choices: list[ChatChoice]
    usage: Usage
    system_fingerprint: str | None = omitted_if_none()
    timings: Timings | None = omitted_if_none()


# Stream deltas leave absent fields out, as OpenAI's chunks do (no `"content": null`).


class DeltaToolCallFunction(BaseModel):
    name: str | None = omitted_if_none()
    arguments: str | None = omitted_if_none()


class DeltaToolCall(BaseModel):
    index: int
    id: str | None = omitted_if_none()
    type: Literal["function"] | None = omitted_if_none()
    function: DeltaToolCallFunction


class ChoiceDelta(BaseModel):
    role: Literal["assistant"] | None = omitted_if_none()
    content: str | None = omitted_if_none()
    reasoning_content: str | None = omitted_if_none()
    reasoning: str | None = omitted_if_none()
    tool_calls: list[DeltaToolCall] | None = omitted_if_none()


class ChunkChoice(BaseModel):
    index: int
    delta: ChoiceDelta
    finish_reason: str | None = None
    logprobs: ChatLogprobs | None = None


class ChatCompletionChunk(BaseModel):
    id: str
    object: Literal["chat.completion.chunk"] = "chat.completion.chunk"
    created: int
    model: str
    choices: list[ChunkChoice]
    usage: Usage | None = omitted_if_none()  # only on the include_usage chunk
    timings: Timings | None = omitted_if_none()
