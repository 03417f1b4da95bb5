"""What is stored of a Responses request's input items: only what the model sees.

Each item keeps the fields `responses_input` reads (role and content, a call's id, name,
namespace and arguments, a call output) and its `id`; anything else a client adds is left out,
and a `reasoning` item without text (which the model never sees) is not stored at all. Run it on
items `responses_input` already accepted: the shapes are checked there.
"""

from __future__ import annotations

from typing import Any, cast

_TEXT_PARTS = ("input_text", "output_text", "text", "summary_text", "reasoning_text")
MAX_KEPT_ID_LEN = 128  # a longer client item id is not kept


def _part(part: dict[str, Any]) -> dict[str, Any]:
    kind = part.get("type")
    if kind in _TEXT_PARTS:
        return {"type": kind, "text": part.get("text")}
    if kind == "refusal":
        return {"type": "refusal", "refusal": part.get("refusal")}
    return {"type": "input_image", "image_url": part.get("image_url")}


def _content(content: Any) -> Any:
    if not isinstance(content, list):
        return content
    return [_part(cast("dict[str, Any]", p)) for p in cast("list[Any]", content)]


def _with_id(item: dict[str, Any], kept: dict[str, Any]) -> dict[str, Any]:
    item_id = item.get("id")
    if isinstance(item_id, str) and len(item_id) <= MAX_KEPT_ID_LEN:
        kept["id"] = item_id
    return kept


def _reasoning_text(item: dict[str, Any]) -> str:
    parts: Any = item.get("content") or item.get("summary") or []
    texts: list[str] = []
    for part in cast("list[Any]", parts if isinstance(parts, list) else []):
        text = cast("dict[str, Any]", part).get("text") if isinstance(part, dict) else None
        texts.append(text if isinstance(text, str) else "")
    return "".join(texts)


def stored_item(item: dict[str, Any]) -> dict[str, Any] | None:
    """The part of one accepted input item the model sees (None: nothing)."""
    kind = item.get("type", "message")
    if kind == "message":
        kept = {"type": "message", "role": item["role"], "content": _content(item["content"])}
    elif kind == "function_call":
        kept = {"type": "function_call", "call_id": item["call_id"], "name": item["name"]}
        if item.get("namespace") is not None:
            kept["namespace"] = item["namespace"]
        kept["arguments"] = item["arguments"]
    elif kind == "function_call_output":
        kept = {
            "type": "function_call_output",
            "call_id": item["call_id"],
            "output": _content(item["output"]),
        }
    else:  # reasoning: its text is the next assistant turn's reasoning
        text = _reasoning_text(item)
        if not text:
            return None
        content = [{"type": "reasoning_text", "text": text}]
        kept = {"type": "reasoning", "summary": [], "content": content}
    return _with_id(item, kept)


def stored_items(items: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """`stored_item` of each item, those without anything for the model left out."""
    return [kept for item in items if (kept := stored_item(item)) is not None]
