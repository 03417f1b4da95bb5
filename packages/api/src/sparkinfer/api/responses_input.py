"""An OpenAI Responses body (plus a stored conversation) → the internal conversation.

Items map to chat messages: `message` items by role (`instructions` first, as a system message;
system and developer messages in their place, for the core's one rule), `function_call` items
become the tool calls of an assistant message, `function_call_output` items tool messages, and
a `reasoning` item the reasoning of the assistant message that follows it. Items of a stored
conversation (`previous_response_id`) come first; errors in them name `previous_response_id`.
"""

from __future__ import annotations

from typing import Any, cast

from sparkinfer.api.conversation_value import Conversation, internal_request
from sparkinfer.api.errors import InvalidRequest
from sparkinfer.api.schemas.responses import FunctionChoice, FunctionTool, ResponsesRequest

_TEXT_PARTS = ("input_text", "output_text", "text", "summary_text", "reasoning_text")
_ROLES = ("user", "assistant", "system", "developer")
LOGPROBS_INCLUDE = "message.output_text.logprobs"


def input_items(req: ResponsesRequest) -> list[dict[str, Any]]:
    """The request's input as items (a string is one user message)."""
    if isinstance(req.input, str):
        return [{"type": "message", "role": "user", "content": req.input}]
    return [dict(item) for item in req.input]


def _text(value: Any, where: str) -> str:
    if not isinstance(value, str):
        raise InvalidRequest(f"{where} must be a string", param=where)
    return value


class _Builder:
    """Internal messages plus, for each, the field of the body it came from."""

    def __init__(self, instructions: str | None) -> None:
        self.system: list[str] = [instructions] if instructions else []
        self.messages: list[dict[str, Any]] = []
        self.paths: list[tuple[str, str]] = []
        self.reasoning: list[str] = []  # from reasoning items, for the next assistant message

    @property
    def offset(self) -> int:
        return 1 if self.system else 0

    def add(self, message: dict[str, Any], source: str, parts: list[str] | None = None) -> None:
        k = len(self.messages) + self.offset
        if message["role"] == "assistant" and self.reasoning:
            message["reasoning_content"] = "\n\n".join(self.reasoning)
            self.reasoning.clear()
        self.messages.append(message)
        self.paths.append((f"messages[{k}]", source))
        for m, part in enumerate(parts or []):
            self.paths.append((f"messages[{k}].content[{m}]", part))

    def last_assistant(self) -> dict[str, Any] | None:
        last = self.messages[-1] if self.messages else None
        return last if last is not None and last["role"] == "assistant" else None

    def all_messages(self) -> tuple[list[dict[str, Any]], list[tuple[str, str]]]:
        if not self.system:
            return self.messages, self.paths
        system = {"role": "system", "content": "\n\n".join(self.system)}
        return [system, *self.messages], [("messages[0]", "instructions"), *self.paths]


def _parts(content: Any, where: str) -> tuple[str | list[dict[str, Any]], list[str]]:
    """A message's content: a string, or text and image parts (with their fields)."""
    if isinstance(content, str):
        return content, []
    if not isinstance(content, list):
        raise InvalidRequest(f"{where} must be a string or a list of content parts", param=where)
    parts: list[dict[str, Any]] = []
    sources: list[str] = []
    for j, raw in enumerate(cast("list[Any]", content)):
        at = f"{where}[{j}]"
        part = cast("dict[str, Any]", raw) if isinstance(raw, dict) else {}
        kind = part.get("type")
        if kind in _TEXT_PARTS:
            parts.append({"type": "text", "text": _text(part.get("text"), f"{at}.text")})
        elif kind == "refusal":
            parts.append({"type": "text", "text": _text(part.get("refusal"), f"{at}.refusal")})
        elif kind == "input_image":
            url = part.get("image_url")
            if not isinstance(url, str) or not url:
                raise InvalidRequest(
                    f"{at}.image_url must be a data: URL (file_id images are not stored here): "
                    "send the image as 'data:<mime type>;base64,<bytes>'",
                    param=f"{at}.image_url",
                )
            parts.append({"type": "image_url", "image_url": {"url": url}})
        else:
            raise InvalidRequest(
                f"{at}.type is {kind!r}; accepted content parts: input_text, output_text, "
                "refusal, input_image",
                param=f"{at}.type",
            )
        sources.append(at)
    return parts, sources


def _joined(content: str | list[dict[str, Any]], where: str) -> str:
    if isinstance(content, str):
        return content
    if any(p["type"] != "text" for p in content):
        raise InvalidRequest(f"{where} takes text parts only", param=where)
    return "".join(p["text"] for p in content)


def _message(b: _Builder, item: dict[str, Any], where: str) -> None:
    role = item.get("role")
    if role not in _ROLES:
        raise InvalidRequest(
            f"{where}.role is {role!r}; accepted roles: {', '.join(_ROLES)}", param=f"{where}.role"
        )
    content, sources = _parts(item.get("content"), f"{where}.content")
    if role in ("system", "developer"):  # in place: the core's one rule places it
        b.add({"role": "system", "content": _joined(content, f"{where}.content")}, where)
        return
    if role == "assistant":
        b.add({"role": "assistant", "content": _joined(content, f"{where}.content")}, where)
        return
    b.add({"role": "user", "content": content}, where, sources)


def _function_call(b: _Builder, item: dict[str, Any], where: str) -> None:
    name = _text(item.get("name"), f"{where}.name")
    namespace = item.get("namespace")
    if namespace is not None:
        name = f"{_text(namespace, f'{where}.namespace')}.{name}"
    fn = {"name": name, "arguments": _text(item.get("arguments"), f"{where}.arguments")}
    call = {
        "id": _text(item.get("call_id"), f"{where}.call_id"),
        "type": "function",
        "function": fn,
    }
    last = b.last_assistant()
    if last is not None and not b.reasoning:
        last.setdefault("tool_calls", []).append(call)
        return
    b.add({"role": "assistant", "content": "", "tool_calls": [call]}, where)


def _function_output(b: _Builder, item: dict[str, Any], where: str) -> None:
    call_id = _text(item.get("call_id"), f"{where}.call_id")
    content, sources = _parts(item.get("output"), f"{where}.output")
    b.add({"role": "tool", "tool_call_id": call_id, "content": content}, where, sources)


def _reasoning(b: _Builder, item: dict[str, Any], where: str) -> None:
    parts: Any = item.get("content") or item.get("summary") or []
    if parts:
        text, _ = _parts(parts, f"{where}.content")
        b.reasoning.append(_joined(text, f"{where}.content"))


_ITEMS = {
    "message": _message,
    "function_call": _function_call,
    "function_call_output": _function_output,
    "reasoning": _reasoning,
}


def _add_items(b: _Builder, items: list[dict[str, Any]], source: str | None) -> None:
    for i, item in enumerate(items):
        where = source or f"input[{i}]"
        kind = item.get("type", "message" if "role" in item else None)
        handler = _ITEMS.get(kind) if isinstance(kind, str) else None
        if handler is None:
            raise InvalidRequest(
                f"{where}.type is {kind!r}; accepted items: {', '.join(_ITEMS)}",
                param=f"{where}.type",
            )
        handler(b, item, where)


# Tools that OpenAI runs on its side; this server runs none of them, so the model does not see
# them (clients such as Codex CLI always send some).
HOSTED_TOOLS = (
    "web_search", "web_search_preview", "file_search", "code_interpreter", "image_generation",
    "computer_use_preview", "computer", "mcp", "local_shell", "tool_search",
)  # fmt: skip


def tool_namespaces(req: ResponsesRequest) -> frozenset[str]:
    """The names of the request's tool namespaces (their calls are `namespace.name` inside)."""
    return frozenset(t.name for t in req.tools or [] if t.type == "namespace" and t.name)


def _function(tool: FunctionTool, where: str, prefix: str = "") -> dict[str, Any]:
    if tool.type != "function":
        raise InvalidRequest(
            f"{where}.type is {tool.type!r}; this server runs function tools (also inside a "
            "namespace) and leaves hosted tools out",
            param=f"{where}.type",
        )
    if tool.name is None:
        raise InvalidRequest(f"{where}.name is required", param=f"{where}.name")
    fn = {"name": prefix + tool.name, "description": tool.description}
    return {"type": "function", "function": {**fn, "parameters": tool.parameters}}


def _tools(req: ResponsesRequest) -> tuple[list[dict[str, Any]] | None, list[tuple[str, str]]]:
    tools: list[dict[str, Any]] = []
    paths: list[tuple[str, str]] = []
    for i, tool in enumerate(req.tools or []):
        if tool.type in HOSTED_TOOLS or tool.type.startswith("web_search"):
            continue
        if tool.type != "namespace":
            paths.append((f"tools[{len(tools)}].function", f"tools[{i}]"))
            tools.append(_function(tool, f"tools[{i}]"))
            continue
        if not tool.name:
            raise InvalidRequest(f"tools[{i}].name is required", param=f"tools[{i}].name")
        for j, inner in enumerate(tool.tools or []):
            where = f"tools[{i}].tools[{j}]"
            paths.append((f"tools[{len(tools)}].function", where))
            tools.append(_function(inner, where, prefix=f"{tool.name}."))
    return tools or None, paths


def _refuse_unsupported(req: ResponsesRequest) -> None:
    if req.background:
        raise InvalidRequest(
            "background is true: background responses are not supported; leave it out",
            param="background",
        )
    if req.conversation is not None:
        raise InvalidRequest(
            "conversation objects are not supported: chain responses with previous_response_id",
            param="conversation",
        )


def _format(req: ResponsesRequest) -> dict[str, Any] | None:
    fmt = req.text.format if req.text is not None else None
    if fmt is None or fmt.type == "text":
        return None
    if fmt.type == "json_object":
        return {"type": "json_object"}
    schema = {"name": fmt.name or "response", "schema": fmt.schema_, "strict": fmt.strict}
    return {"type": "json_schema", "json_schema": schema}


def to_conversation(req: ResponsesRequest, history: list[dict[str, Any]]) -> Conversation:
    """The internal conversation of a Responses body after `history` (a stored conversation)."""
    _refuse_unsupported(req)
    b = _Builder(req.instructions)
    _add_items(b, history, "previous_response_id")
    _add_items(b, input_items(req), None)
    messages, paths = b.all_messages()
    tools, tool_paths = _tools(req)
    choice: Any = req.tool_choice
    if isinstance(choice, FunctionChoice):
        choice = {"type": "function", "function": {"name": choice.name}}
    r = req.reasoning
    fields: dict[str, Any] = {
        "messages": messages,
        "tools": tools,
        "tool_choice": choice,
        "parallel_tool_calls": req.parallel_tool_calls,
        "max_tokens": req.max_output_tokens,
        "temperature": req.temperature,
        "top_p": req.top_p,
        "top_k": req.top_k,
        "user": req.user,
        "response_format": _format(req),
        "reasoning": None if r is None else {"effort": r.effort, "max_tokens": r.max_tokens},
        "logprobs": LOGPROBS_INCLUDE in (req.include or []),
        "top_logprobs": req.top_logprobs if LOGPROBS_INCLUDE in (req.include or []) else None,
    }
    paths += [
        *tool_paths,
        ("messages", "input"),
        ("max_tokens", "max_output_tokens"),
        ("tool_choice.function.name", "tool_choice.name"),
        ("response_format.json_schema.schema", "text.format.schema"),
        ("response_format", "text.format"),
    ]
    return internal_request(fields, paths)
