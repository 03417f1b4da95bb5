"""Chat messages → the rendered prompt, with the rules every protocol shares.

- System and developer messages may come anywhere, as in OpenAI's API: the leading ones become
  the one system message (their texts joined by a blank line), and a later one is a user turn
  in its place (the template takes one system message, first; keeping a later one in place
  keeps the prompt's prefix, and its cache, stable).
- A final assistant message may be continued rather than closed (assistant prefill): the prompt
  then ends inside that message, after its text, and the model writes on from there (its
  reasoning, if any, is closed).

Template errors name the client's message indices (`messages[3]`), not the merged ones.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Mapping, Sequence
from typing import Any, cast

from sparkinfer.model.chat_template import (
    ChatOptions,
    ChatTemplate,
    ChatTemplateError,
    RenderedPrompt,
)

_SYSTEM_ROLES = ("system", "developer")
_MESSAGE_INDEX = re.compile(r"messages\[(\d+)\]")
_TURN_END = "<|im_end|>"


def place_system_messages(
    messages: Sequence[Mapping[str, Any]],
) -> tuple[list[dict[str, Any]], list[int]]:
    """The messages with the system rule applied, and for each the index it came from."""
    out: list[dict[str, Any]] = []
    origin: list[int] = []
    for i, msg in enumerate(messages):
        if msg.get("role") not in _SYSTEM_ROLES:
            out.append(dict(msg))
            origin.append(i)
            continue
        is_leading = all(m["role"] == "system" for m in out)
        text, first = _text(msg.get("content")), _text(out[0].get("content")) if out else None
        if is_leading and out and text is not None and first is not None:
            out[0] = {**out[0], "content": f"{first}\n\n{text}" if first else text}
            continue
        out.append(dict(msg, role="system" if is_leading else "user"))
        origin.append(i)
    return out, origin


def _text(content: Any) -> str | None:
    """A message content as text; None when it holds media (it cannot be merged)."""
    if content is None or isinstance(content, str):
        return content or ""
    parts = cast("list[Any]", content) if isinstance(content, list) else []
    if not parts or any(not isinstance(p, Mapping) for p in parts):
        return None
    typed = cast("list[Mapping[str, Any]]", parts)
    if any(p.get("type") != "text" or not isinstance(p.get("text"), str) for p in typed):
        return None
    return "".join(p["text"] for p in typed)


def render_chat(
    template: ChatTemplate,
    messages: Sequence[Mapping[str, Any]],
    *,
    tools: list[dict[str, Any]] | None,
    options: ChatOptions,
    is_continued: bool = False,
) -> RenderedPrompt:
    """Render `messages` (`is_continued`: the final assistant message is left open)."""
    placed, origin = place_system_messages(messages)
    if is_continued:
        options = dataclasses.replace(options, add_generation_prompt=False)
    try:
        rendered = template.render(placed, tools=tools, options=options)
    except ChatTemplateError as exc:
        raise _renumbered(exc, origin) from None
    return _left_open(rendered) if is_continued else rendered


def _left_open(rendered: RenderedPrompt) -> RenderedPrompt:
    """The prompt cut before the final message's end-of-turn marker."""
    segments = rendered.segments
    ends = [i for i, s in enumerate(segments) if s.is_special and s.text == _TURN_END]
    if not ends:
        raise ChatTemplateError(
            f"this chat template does not end a turn with {_TURN_END}, so the final assistant "
            "message cannot be continued: leave continue_final_message out",
            param="continue_final_message",
        )
    kept = segments[: ends[-1]]
    return RenderedPrompt("".join(s.text for s in kept), kept)


def _renumbered(exc: ChatTemplateError, origin: list[int]) -> ChatTemplateError:
    def back(match: re.Match[str]) -> str:
        idx = int(match.group(1))
        return f"messages[{origin[idx] if idx < len(origin) else idx}]"

    param = None if exc.param is None else _MESSAGE_INDEX.sub(back, exc.param)
    return ChatTemplateError(_MESSAGE_INDEX.sub(back, exc.message), param=param)
