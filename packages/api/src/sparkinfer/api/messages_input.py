"""An Anthropic Messages body → the internal conversation (`conversation.Conversation`).

`system` becomes the first message; a user message's `tool_result` blocks become tool messages
(in block order, around its text and images); an assistant message's `thinking` blocks become
its reasoning and its `tool_use` blocks its tool calls. Base64 image sources become `data:` URLs
(URL and file sources are refused: the server never fetches for a client). Thinking is off
unless `thinking` turns it on, as in Anthropic's API; `budget_tokens` is the reasoning budget.
"""

from __future__ import annotations

from typing import Any

from sparkinfer.api.conversation_value import Conversation, internal_request
from sparkinfer.api.errors import InvalidMedia, InvalidRequest
from sparkinfer.api.schemas.messages import (
    CountTokensRequest,
    ImageBlock,
    InputMessage,
    MessagesRequest,
    TextBlock,
    ThinkingBlock,
    ToolResultBlock,
    ToolUseBlock,
)


class _Builder:
    """Internal messages plus, for each, the Anthropic field it came from."""

    def __init__(self) -> None:
        self.messages: list[dict[str, Any]] = []
        self.paths: list[tuple[str, str]] = []

    def add(self, message: dict[str, Any], source: str, parts: list[str] | None = None) -> None:
        k = len(self.messages)
        self.messages.append(message)
        self.paths.append((f"messages[{k}]", source))
        for m, part in enumerate(parts or []):
            self.paths.append((f"messages[{k}].content[{m}]", part))
            self.paths.append((f"messages[{k}].content[{m}].image_url", f"{part}.source"))


def _image_part(block: ImageBlock, where: str) -> dict[str, Any]:
    src = block.source
    if src.type != "base64" or not src.data or not src.media_type:
        raise InvalidMedia(
            f"{where}.source is a {src.type!r} source; only base64 sources (with media_type "
            "and data) are taken, the server never fetches for a client: send the image as "
            "base64",
            param=f"{where}.source",
        )
    return {"type": "image_url", "image_url": {"url": f"data:{src.media_type};base64,{src.data}"}}


def _parts(
    blocks: list[tuple[int, TextBlock | ImageBlock]], where: str
) -> tuple[list[dict[str, Any]], list[str]]:
    parts: list[dict[str, Any]] = []
    sources: list[str] = []
    for j, block in blocks:
        at = f"{where}[{j}]"
        if isinstance(block, TextBlock):
            parts.append({"type": "text", "text": block.text})
        else:
            parts.append(_image_part(block, at))
        sources.append(at)
    return parts, sources


def _tool_result(block: ToolResultBlock, where: str) -> tuple[dict[str, Any], list[str]]:
    content = block.content
    if content is None or isinstance(content, str):
        text = content or ""
        return {"role": "tool", "tool_call_id": block.tool_use_id, "content": text}, []
    parts, sources = _parts(list(enumerate(content)), f"{where}.content")
    return {"role": "tool", "tool_call_id": block.tool_use_id, "content": parts}, sources


def _user(b: _Builder, msg: InputMessage, i: int) -> None:
    where = f"messages[{i}]"
    if isinstance(msg.content, str):
        b.add({"role": "user", "content": msg.content}, where)
        return
    pending: list[tuple[int, TextBlock | ImageBlock]] = []

    def flush() -> None:
        if pending:
            parts, sources = _parts(pending, f"{where}.content")
            b.add({"role": "user", "content": parts}, where, sources)
            pending.clear()

    for j, block in enumerate(msg.content):
        if isinstance(block, ToolResultBlock):
            flush()
            message, sources = _tool_result(block, f"{where}.content[{j}]")
            b.add(message, f"{where}.content[{j}]", sources)
        elif isinstance(block, TextBlock | ImageBlock):
            pending.append((j, block))
        elif not isinstance(block, ThinkingBlock):  # thinking in a user turn carries nothing
            raise InvalidRequest(
                f"{where}.content[{j}] is a {block.type} block, which only assistant messages "
                "hold: move it to the assistant message",
                param=f"{where}.content[{j}]",
            )
    flush()


def _assistant(b: _Builder, msg: InputMessage, i: int) -> None:
    where = f"messages[{i}]"
    if isinstance(msg.content, str):
        b.add({"role": "assistant", "content": msg.content}, where)
        return
    text: list[str] = []
    reasoning: list[str] = []
    calls: list[dict[str, Any]] = []
    for j, block in enumerate(msg.content):
        if isinstance(block, TextBlock):
            text.append(block.text)
        elif isinstance(block, ThinkingBlock):
            reasoning.append(block.thinking)
        elif isinstance(block, ToolUseBlock):
            fn = {"name": block.name, "arguments": block.input}
            calls.append({"id": block.id, "type": "function", "function": fn})
        elif isinstance(block, ImageBlock | ToolResultBlock):
            raise InvalidRequest(
                f"{where}.content[{j}] is a {block.type} block, which only user messages hold: "
                "move it to a user message",
                param=f"{where}.content[{j}]",
            )
    message: dict[str, Any] = {"role": "assistant", "content": "".join(text)}
    if reasoning:
        message["reasoning_content"] = "\n\n".join(reasoning)
    if calls:
        message["tool_calls"] = calls
    b.add(message, where)


def _system_message(b: _Builder, msg: InputMessage, i: int) -> None:
    """A system message inside `messages`, in its place (the core's one rule places it: see
    `chat_render`)."""
    where = f"messages[{i}]"
    blocks = list(enumerate(msg.content)) if isinstance(msg.content, list) else []
    if any(not isinstance(block, TextBlock) for _, block in blocks):
        raise InvalidRequest(f"{where}.content takes text blocks only", param=f"{where}.content")
    text = (
        msg.content
        if isinstance(msg.content, str)
        else "".join(block.text for _, block in blocks if isinstance(block, TextBlock))
    )
    b.add({"role": "system", "content": text}, where)


def _system(req: CountTokensRequest) -> str | None:
    if req.system is None or isinstance(req.system, str):
        return req.system or None
    return "\n\n".join(block.text for block in req.system) or None


def _tools(req: CountTokensRequest) -> tuple[list[dict[str, Any]] | None, list[tuple[str, str]]]:
    if not req.tools:
        return None, []
    tools: list[dict[str, Any]] = []
    paths: list[tuple[str, str]] = []
    for i, tool in enumerate(req.tools):
        if tool.type not in (None, "custom"):
            raise InvalidRequest(
                f"tools[{i}].type is {tool.type!r}, a server tool this server does not run: "
                "define it as a client tool (name, description, input_schema)",
                param=f"tools[{i}].type",
            )
        schema = tool.input_schema if tool.input_schema is not None else {"type": "object"}
        fn = {"name": tool.name, "description": tool.description, "parameters": schema}
        tools.append({"type": "function", "function": fn})
        paths += [
            (f"tools[{i}].function.parameters", f"tools[{i}].input_schema"),
            (f"tools[{i}].function", f"tools[{i}]"),
        ]
    return tools, paths


def _tool_choice(req: CountTokensRequest) -> tuple[Any, bool]:
    """The internal tool_choice and parallel_tool_calls."""
    choice = req.tool_choice
    if choice is None:
        return None, True
    is_parallel = not choice.disable_parallel_tool_use
    if choice.type == "tool":
        if not choice.name:
            raise InvalidRequest(
                "tool_choice.name is required with tool_choice type 'tool'", param="tool_choice"
            )
        return {"type": "function", "function": {"name": choice.name}}, is_parallel
    return {"auto": "auto", "any": "required", "none": "none"}[choice.type], is_parallel


def _thinking(req: CountTokensRequest, max_tokens: int | None) -> dict[str, Any]:
    """Thinking fields of the internal request: off unless `thinking` turns it on."""
    t = req.thinking
    fields: dict[str, Any] = {"enable_thinking": t is not None and t.type != "disabled"}
    if t is not None and t.type == "enabled":
        if t.budget_tokens is None:
            raise InvalidRequest(
                "thinking.budget_tokens is required with thinking type 'enabled'",
                param="thinking.budget_tokens",
            )
        if max_tokens is not None and t.budget_tokens >= max_tokens:
            raise InvalidRequest(
                f"max_tokens ({max_tokens}) must be greater than thinking.budget_tokens "
                f"({t.budget_tokens}): raise max_tokens or lower the budget",
                param="thinking.budget_tokens",
            )
        fields["reasoning"] = {"max_tokens": t.budget_tokens}
    effort = req.output_config.effort if req.output_config is not None else None
    if fields["enable_thinking"] and effort is not None:
        fields["reasoning_effort"] = effort
    return fields


def to_conversation(req: CountTokensRequest) -> Conversation:
    """The internal conversation of a Messages (or count_tokens) body; a max_tokens beyond the
    room the prompt leaves is lowered to it, as in Anthropic's API."""
    b = _Builder()
    system = _system(req)
    if system is not None:
        b.add({"role": "system", "content": system}, "system")
    for i, msg in enumerate(req.messages):
        if msg.role == "system":
            _system_message(b, msg, i)
        else:
            (_user if msg.role == "user" else _assistant)(b, msg, i)
    tools, tool_paths = _tools(req)
    choice, is_parallel = _tool_choice(req)
    fields: dict[str, Any] = {
        "messages": b.messages,
        "tools": tools,
        "tool_choice": choice,
        "parallel_tool_calls": is_parallel,
        # A final assistant turn is a prefill: the answer continues it, as in Anthropic's API.
        "continue_final_message": req.messages[-1].role == "assistant",
    }
    paths = [*b.paths, *tool_paths, ("tool_choice.function.name", "tool_choice.name")]
    max_tokens = None
    if isinstance(req, MessagesRequest):
        max_tokens = req.max_tokens
        fields |= {
            "max_tokens": req.max_tokens,
            "stop": req.stop_sequences,
            "temperature": req.temperature,
            "top_p": req.top_p,
            "top_k": req.top_k,
            "user": req.metadata.user_id if req.metadata is not None else None,
        }
        paths += [("stop", "stop_sequences"), ("reasoning.max_tokens", "thinking.budget_tokens")]
    fields |= _thinking(req, max_tokens)
    fmt = req.output_config.format if req.output_config is not None else None
    if fmt is not None:
        schema = {"name": "output", "schema": fmt.schema_}
        fields["response_format"] = {"type": "json_schema", "json_schema": schema}
        paths.append(("response_format.json_schema.schema", "output_config.format.schema"))
        paths.append(("response_format", "output_config.format"))
    return internal_request(fields, paths, is_fit_to_context=True)
