"""The one output parser's result as Responses output items, whole or as the event stream.

Items come in the order the model wrote them: a `reasoning` item (its text as `reasoning_text`
content), a `message` item with one `output_text` part, then one `function_call` item per call.
A stream is `response.created` and `response.in_progress`, then per item
`response.output_item.added`, its deltas (`response.reasoning_text.delta`,
`response.output_text.delta` inside `response.content_part.added`/`done`,
`response.function_call_arguments.delta`) and `response.output_item.done`, then
`response.completed`, or `response.incomplete` when `max_output_tokens` cut the answer.
"""

from __future__ import annotations

import json
import secrets
from typing import Any, Literal

from sparkinfer.api.conversation import Turn
from sparkinfer.api.schemas.chat import ChoiceDelta
from sparkinfer.api.schemas.common import TokenLogprobEntry
from sparkinfer.api.schemas.responses import (
    IncompleteDetails,
    InputTokensDetails,
    OutputTokensDetails,
    ResponseObject,
    ResponseUsage,
)
from sparkinfer.model.tokenizer import Tokenizer

_Kind = Literal["reasoning", "message", "function_call"]


def item_id(prefix: str) -> str:
    return f"{prefix}_{secrets.token_hex(12)}"


def usage(turn: Turn, tokenizer: Tokenizer) -> ResponseUsage:
    """Responses usage, with the reasoning tokens counted as chat counts them."""
    u = turn.usage
    counter = turn.reasoning_tokens
    reasoning = 0
    if counter is not None:
        reasoning = counter.count(turn.output.reasoning)
    elif turn.output.reasoning:
        reasoning = len(tokenizer.encode(turn.output.reasoning))
    return ResponseUsage(
        input_tokens=u.prompt_tokens,
        input_tokens_details=InputTokensDetails(
            cached_tokens=u.prompt_tokens_details.cached_tokens
        ),
        output_tokens=u.completion_tokens,
        output_tokens_details=OutputTokensDetails(
            reasoning_tokens=min(reasoning, u.completion_tokens)
        ),
        total_tokens=u.total_tokens,
    )


def finished(response: ResponseObject, turn: Turn, tokenizer: Tokenizer) -> ResponseObject:
    """`response` with its final status and usage (output items set by the caller)."""
    is_cut = turn.finish_reason == "length"
    return response.model_copy(
        update={
            "status": "incomplete" if is_cut else "completed",
            "incomplete_details": IncompleteDetails(reason="max_output_tokens") if is_cut else None,
            "usage": usage(turn, tokenizer),
        }
    )


def _reasoning_item(rid: str, text: str, status: str) -> dict[str, Any]:
    content = [{"type": "reasoning_text", "text": text}] if text else []
    return {"id": rid, "type": "reasoning", "summary": [], "content": content, "status": status}


def _text_part(text: str, logprobs: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    return {"type": "output_text", "text": text, "annotations": [], "logprobs": logprobs or []}


def _logprobs(entries: list[TokenLogprobEntry]) -> list[dict[str, Any]]:
    """Logprob entries as the Responses API writes them (token, logprob, bytes, top_logprobs)."""
    return [e.model_dump(mode="json") for e in entries]


def _message_item(
    mid: str, text: str | None, status: str, logprobs: list[dict[str, Any]] | None = None
) -> dict[str, Any]:
    content = [] if text is None else [_text_part(text, logprobs)]
    return {"id": mid, "type": "message", "role": "assistant", "status": status, "content": content}


def _call_item(
    fid: str, call_id: str, name: str, args: str, status: str, namespaces: frozenset[str]
) -> dict[str, Any]:
    """A function_call item; a call of `namespace.name` is `name` with its `namespace`."""
    item = {
        "id": fid, "type": "function_call", "call_id": call_id, "name": name, "arguments": args,
        "status": status,
    }  # fmt: skip
    namespace, dot, rest = name.partition(".")
    if dot and namespace in namespaces:
        item["name"], item["namespace"] = rest, namespace
    return item


def output_items(turn: Turn, namespaces: frozenset[str] = frozenset()) -> list[dict[str, Any]]:
    """The finished answer's items (non-streaming)."""
    out = turn.output
    status = "incomplete" if turn.finish_reason == "length" else "completed"
    items: list[dict[str, Any]] = []
    if out.reasoning:
        items.append(_reasoning_item(item_id("rs"), out.reasoning, status))
    if out.content:
        items.append(_message_item(item_id("msg"), out.content, status, _logprobs(turn.logprobs)))
    for call in out.tool_calls:
        fn = call.function
        items.append(
            _call_item(item_id("fc"), call.id, fn.name, fn.arguments, "completed", namespaces)
        )
    return items


def sse_event(payload: dict[str, Any]) -> bytes:
    text = json.dumps(payload, ensure_ascii=False, separators=(",", ":"))
    return f"event: {payload['type']}\ndata: {text}\n\n".encode()


class ResponseEvents:
    """Turns output deltas into Responses events, numbered; one instance per streamed response."""

    def __init__(self, namespaces: frozenset[str] = frozenset()) -> None:
        self.items: list[dict[str, Any]] = []  # finished items, in output order
        self._namespaces = namespaces
        self._seq = 0
        self._kind: _Kind | None = None
        self._item: dict[str, Any] = {}
        self._text = ""
        self._logprobs: list[dict[str, Any]] = []  # the open message's, when asked for

    def _event(self, kind: str, **fields: Any) -> bytes:
        payload = {"type": kind, "sequence_number": self._seq, **fields}
        self._seq += 1
        return sse_event(payload)

    def error(self, error: dict[str, Any]) -> bytes:
        """The `error` event that ends a failed stream (an OpenAI error body's fields)."""
        fields = {k: error.get(k) for k in ("code", "message", "param")}
        return self._event("error", **fields)

    def lifecycle(self, kind: str, response: ResponseObject) -> bytes:
        return self._event(kind, response=response.model_dump(mode="json"))

    def feed(
        self, deltas: list[ChoiceDelta], logprobs: list[TokenLogprobEntry] | None = None
    ) -> list[bytes]:
        """Events of one step's deltas; `logprobs` (of the content the step released) ride on
        its first text delta."""
        out: list[bytes] = []
        pending = _logprobs(logprobs or [])
        for d in deltas:
            if d.reasoning_content:
                self._open("reasoning", _reasoning_item(item_id("rs"), "", "in_progress"), out)
                out.append(self._text_delta("response.reasoning_text.delta", d.reasoning_content))
            if d.content:
                self._open("message", _message_item(item_id("msg"), None, "in_progress"), out)
                self._logprobs += pending
                out.append(self._text_delta("response.output_text.delta", d.content, pending))
                pending = []
            for call in d.tool_calls or []:
                fn = call.function
                if call.id is not None:
                    fid, name = item_id("fc"), fn.name or ""
                    item = _call_item(fid, call.id, name, "", "in_progress", self._namespaces)
                    self._open("function_call", item, out, is_new=True)
                if fn.arguments:
                    self._text += fn.arguments
                    out.append(
                        self._event(
                            "response.function_call_arguments.delta",
                            item_id=self._item["id"],
                            output_index=len(self.items),
                            delta=fn.arguments,
                        )
                    )
        return out

    def finish(self, turn: Turn) -> list[bytes]:
        out: list[bytes] = []
        self._close(out, "incomplete" if turn.finish_reason == "length" else "completed")
        return out

    def _text_delta(
        self, kind: str, delta: str, logprobs: list[dict[str, Any]] | None = None
    ) -> bytes:
        self._text += delta
        return self._event(
            kind,
            item_id=self._item["id"],
            output_index=len(self.items),
            content_index=0,
            delta=delta,
            **({"logprobs": logprobs or []} if kind == "response.output_text.delta" else {}),
        )

    def _open(
        self, kind: _Kind, item: dict[str, Any], out: list[bytes], *, is_new: bool = False
    ) -> None:
        if self._kind == kind and not is_new:
            return
        self._close(out, "completed")
        self._kind, self._item, self._text, self._logprobs = kind, item, "", []
        index = len(self.items)
        out.append(self._event("response.output_item.added", output_index=index, item=item))
        if kind == "message":
            out.append(
                self._event(
                    "response.content_part.added",
                    item_id=item["id"],
                    output_index=index,
                    content_index=0,
                    part=_text_part(""),
                )
            )

    def _close(self, out: list[bytes], status: str) -> None:
        if self._kind is None:
            return
        index, item, text = len(self.items), self._item, self._text
        where = {"item_id": item["id"], "output_index": index}
        if self._kind == "reasoning":
            done = _reasoning_item(item["id"], text, status)
            out.append(
                self._event("response.reasoning_text.done", **where, content_index=0, text=text)
            )
        elif self._kind == "message":
            logprobs = self._logprobs
            done = _message_item(item["id"], text, status, logprobs)
            out.append(
                self._event(
                    "response.output_text.done",
                    **where,
                    content_index=0,
                    text=text,
                    logprobs=logprobs,
                )
            )
            out.append(
                self._event(
                    "response.content_part.done",
                    **where,
                    content_index=0,
                    part=_text_part(text, logprobs),
                )
            )
        else:
            done = {**item, "arguments": text, "status": "completed"}
            out.append(
                self._event(
                    "response.function_call_arguments.done",
                    **where,
                    name=item["name"],
                    arguments=text,
                )
            )
        out.append(self._event("response.output_item.done", output_index=index, item=done))
        self.items.append(done)
        self._kind = None
