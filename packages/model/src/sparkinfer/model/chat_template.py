"""Chat template: OpenAI-style messages + tools + options → a prompt safe to tokenize.

The checkpoint's own template (chat_template.jinja, or `chat_template` in tokenizer_config.json)
is used when present, else the built-in Qwen3.8 template (`templates/qwen3_8.jinja`). Templates
run in jinja2's immutable sandbox with the same globals and filters as transformers'
`apply_chat_template`, so a template renders here exactly as it does there.

Special safety: before rendering, every control-token text found in a caller-supplied string
(`<|im_end|>`, `<think>`, …) is swapped for a private-use placeholder; after rendering the
placeholders are swapped back and marked as plain text. `RenderedPrompt.segments` therefore marks
only template-inserted markers as special, and `Tokenizer.encode_chat(segments)` turns a
user's literal "<|im_end|>" into ordinary byte tokens, never id 248046.
"""

from __future__ import annotations

import json
import re
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from importlib import resources
from pathlib import Path
from typing import Any, NamedTuple

import jinja2
import jinja2.ext
from jinja2.sandbox import ImmutableSandboxedEnvironment
from sparkinfer.model.tokenizer import PromptSegment, Tokenizer


class ChatTemplateError(ValueError):
    """The messages, tools or options cannot be rendered; `param` names the field to fix."""

    def __init__(self, message: str, *, param: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.param = param


@dataclass(frozen=True)
class ChatOptions:
    """Template switches. `template_kwargs` (a request's chat_template_kwargs) win over the rest."""

    add_generation_prompt: bool = True
    enable_thinking: bool = True
    reasoning_effort: str | None = None  # None: the template's default (xhigh for Qwen3.8)
    preserve_thinking: bool = True
    template_kwargs: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class RenderedPrompt:
    """The prompt text and its split into plain text and template-inserted control tokens."""

    text: str
    segments: tuple[PromptSegment, ...]


class ReasoningSetting(NamedTuple):
    """A client's reasoning_effort translated for the template (None: leave the default)."""

    enable_thinking: bool | None
    reasoning_effort: str | None


_EFFORT_MAP: dict[str, ReasoningSetting] = {
    "none": ReasoningSetting(False, None),
    "minimal": ReasoningSetting(True, "low"),
    "low": ReasoningSetting(True, "low"),
    "medium": ReasoningSetting(True, "medium"),
    "high": ReasoningSetting(True, "xhigh"),
    "xhigh": ReasoningSetting(True, "xhigh"),
    "max": ReasoningSetting(True, "xhigh"),
}
_ROLES = ("system", "user", "assistant", "tool")
_IMAGE_TYPES = ("image_url", "image")
_VIDEO_TYPES = ("video_url", "video")
_RESERVED_KWARGS = ("messages", "tools")
_PRIVATE_USE = re.compile("[\ue000-\uf8ff\U000f0000-\U000ffffd]")
_PRIVATE_USE_CODES = (*range(0xE000, 0xF900), *range(0xF0000, 0xFFFFE))


def map_reasoning_effort(value: str | None, *, param: str = "reasoning_effort") -> ReasoningSetting:
    """Map a client's effort (none|minimal|low|medium|high|xhigh|max) to Qwen3.8's levels."""
    if value is None:
        return ReasoningSetting(None, None)
    setting = _EFFORT_MAP.get(value)
    if setting is None:
        raise ChatTemplateError(
            f"{param} is {value!r}; accepted values: {', '.join(_EFFORT_MAP)} "
            "(none turns thinking off)",
            param=param,
        )
    return setting


class _Namespace(jinja2.utils.Namespace):
    """`namespace()` that refuses underscore names, as in transformers (no sandbox escapes)."""

    def __init__(*args: Any, **kwargs: Any) -> None:
        self, rest = args[0], args[1:]
        attrs = dict(*rest, **kwargs)
        for name in attrs:
            _Namespace._check(name)
        jinja2.utils.Namespace.__init__(self, attrs)

    def __setitem__(self, name: str, value: Any) -> None:
        _Namespace._check(name)
        jinja2.utils.Namespace.__setitem__(self, name, value)

    @staticmethod
    def _check(name: object) -> None:
        if isinstance(name, str) and name.startswith("_"):
            raise jinja2.exceptions.SecurityError(f"namespace attribute {name!r} is not allowed")


class _TemplateRaised(jinja2.exceptions.TemplateError):
    """raise_exception() called by the template itself."""


def _raise_exception(message: str) -> None:
    raise _TemplateRaised(message)


def _tojson(
    value: Any,
    ensure_ascii: bool = False,
    indent: int | None = None,
    separators: tuple[str, str] | None = None,
    sort_keys: bool = False,
) -> str:
    # As transformers: no HTML escaping, non-ASCII kept, keys in order, ", " / ": " separators.
    return json.dumps(
        value, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys
    )


def _compile(source: str) -> jinja2.Template:
    env = ImmutableSandboxedEnvironment(
        trim_blocks=True, lstrip_blocks=True, extensions=[jinja2.ext.loopcontrols]
    )
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise_exception
    env.globals["strftime_now"] = lambda fmt: datetime.now().strftime(fmt)
    env.globals["namespace"] = _Namespace
    env.globals["dict"] = lambda *args, **kwargs: dict(*args, **kwargs)
    try:
        return env.from_string(source)
    except jinja2.exceptions.TemplateSyntaxError as exc:
        raise ChatTemplateError(
            f"chat template does not compile (line {exc.lineno}: {exc.message}): "
            "fix chat_template.jinja or remove it to use the built-in Qwen3.8 template"
        ) from exc


class ChatTemplate:
    """A compiled chat template plus the control tokens it may insert."""

    def __init__(self, source: str, *, control_tokens: Collection[str], is_builtin: bool = False):
        self.source = source
        self.is_builtin = is_builtin
        self._template = _compile(source)
        self._control = sorted(control_tokens, key=len, reverse=True)
        self._control_re = re.compile("|".join(re.escape(t) for t in self._control))

    @classmethod
    def builtin(cls, tokenizer: Tokenizer) -> ChatTemplate:
        """The Qwen3.8 template shipped with this package."""
        source = (resources.files("sparkinfer.model") / "templates" / "qwen3_8.jinja").read_text(
            encoding="utf-8"
        )
        return cls(source, control_tokens=tokenizer.control_tokens, is_builtin=True)

    @classmethod
    def from_checkpoint(cls, path: str | Path, tokenizer: Tokenizer) -> ChatTemplate:
        """chat_template.jinja, else tokenizer_config.json's chat_template, else the built-in."""
        folder = Path(path)
        jinja_file = folder / "chat_template.jinja"
        if jinja_file.is_file():
            return cls(
                jinja_file.read_text(encoding="utf-8"), control_tokens=tokenizer.control_tokens
            )
        config_file = folder / "tokenizer_config.json"
        source = None
        if config_file.is_file():
            try:
                source = json.loads(config_file.read_text(encoding="utf-8")).get("chat_template")
            except (ValueError, AttributeError) as exc:
                raise ChatTemplateError(f"{config_file} is not a JSON object ({exc})") from exc
        if isinstance(source, list):  # named templates: [{"name": "default", "template": ...}]
            named = {t.get("name"): t.get("template") for t in source if isinstance(t, dict)}
            source = named.get("default")
        if isinstance(source, str) and source.strip():
            return cls(source, control_tokens=tokenizer.control_tokens)
        return cls.builtin(tokenizer)

    def render(
        self,
        messages: Sequence[Mapping[str, Any]],
        *,
        tools: Sequence[Mapping[str, Any]] | None = None,
        options: ChatOptions | None = None,
    ) -> RenderedPrompt:
        """Render OpenAI-style messages (and tools) into a prompt with special-safe segments."""
        options = options or ChatOptions()
        kwargs = _template_kwargs(options)
        prepared = [_prepare_message(i, msg) for i, msg in enumerate(messages)]
        if tools is not None and (
            isinstance(tools, (str, Mapping)) or not isinstance(tools, Sequence)
        ):
            raise ChatTemplateError("tools must be a list of tool objects or null", param="tools")
        escaper = _Escaper(self._control_re, (prepared, tools, kwargs, self.source))
        context = escaper.escape(
            {**kwargs, "messages": prepared, "tools": list(tools or []) or None}
        )
        try:
            rendered = self._template.render(**context)
        except _TemplateRaised as exc:
            message, param = _explain(str(exc), prepared, kwargs)
            raise ChatTemplateError(message, param=param) from None
        except (jinja2.exceptions.TemplateError, TypeError, ValueError) as exc:
            raise ChatTemplateError(
                f"the chat template could not render these messages ({type(exc).__name__}: {exc}); "
                "check the messages' shapes and chat_template_kwargs"
            ) from None
        segments = escaper.restore(rendered)
        return RenderedPrompt("".join(s.text for s in segments), segments)


def _template_kwargs(options: ChatOptions) -> dict[str, Any]:
    kwargs: dict[str, Any] = {
        "add_generation_prompt": options.add_generation_prompt,
        "enable_thinking": options.enable_thinking,
        "preserve_thinking": options.preserve_thinking,
    }
    if options.reasoning_effort is not None:
        kwargs["reasoning_effort"] = options.reasoning_effort
    for name in _RESERVED_KWARGS:
        if name in options.template_kwargs:
            raise ChatTemplateError(
                f"chat_template_kwargs.{name} is reserved: send {name} as the request's own field",
                param=f"chat_template_kwargs.{name}",
            )
    kwargs.update(options.template_kwargs)
    return kwargs


class _Escaper:
    """Swaps control-token text in caller strings for placeholders, and back after rendering."""

    def __init__(self, control_re: re.Pattern[str], inputs: object) -> None:
        used: set[str] = set()
        _collect_private_use(inputs, used)
        # A private-use character that occurs nowhere in the inputs or the template delimits
        # the placeholders, so they cannot collide with real text.
        free = (chr(c) for c in _PRIVATE_USE_CODES if chr(c) not in used)
        mark = next(free, None)
        if mark is None:
            raise ChatTemplateError(
                "messages use every private-use character (U+E000-U+F8FF, U+F0000-U+FFFFD); "
                "one must stay free to render the prompt: send fewer distinct ones",
                param="messages",
            )
        self._mark = mark
        self._control_re = control_re
        self._literals: list[str] = []
        self._output_re = re.compile(f"{self._mark}(\\d+){self._mark}|{control_re.pattern}")

    def escape(self, value: Any) -> Any:
        if isinstance(value, str):
            return self._control_re.sub(self._placeholder, value)
        if isinstance(value, Mapping):
            return {self.escape(k): self.escape(v) for k, v in value.items()}
        if isinstance(value, (list, tuple)):
            return [self.escape(v) for v in value]
        return value

    def _placeholder(self, match: re.Match[str]) -> str:
        self._literals.append(match.group(0))
        return f"{self._mark}{len(self._literals) - 1}{self._mark}"

    def restore(self, rendered: str) -> tuple[PromptSegment, ...]:
        segments: list[PromptSegment] = []
        text: list[str] = []
        pos = 0
        for match in self._output_re.finditer(rendered):
            text.append(rendered[pos : match.start()])
            pos = match.end()
            if match.group(1) is not None:
                text.append(self._literals[int(match.group(1))])
                continue
            if any(text):
                segments.append(PromptSegment("".join(text), False))
            text.clear()
            segments.append(PromptSegment(match.group(0), True))
        text.append(rendered[pos:])
        if any(text):
            segments.append(PromptSegment("".join(text), False))
        return tuple(segments)


def _collect_private_use(value: object, used: set[str]) -> None:
    if isinstance(value, str):
        used.update(_PRIVATE_USE.findall(value))
    elif isinstance(value, Mapping):
        for k, v in value.items():
            _collect_private_use(k, used)
            _collect_private_use(v, used)
    elif isinstance(value, (list, tuple)):
        for v in value:
            _collect_private_use(v, used)


def _prepare_message(i: int, msg: Mapping[str, Any]) -> dict[str, Any]:
    """Check one OpenAI message and convert it to what Qwen templates read."""
    if not isinstance(msg, Mapping):
        raise ChatTemplateError(
            f"messages[{i}] must be an object with a role; got {msg!r:.80}", param=f"messages[{i}]"
        )
    role = msg.get("role")
    role = "system" if role == "developer" else role
    if role not in _ROLES:
        raise ChatTemplateError(
            f"messages[{i}].role is {role!r}; "
            "accepted roles: system, developer, user, assistant, tool",
            param=f"messages[{i}].role",
        )
    out = dict(msg, role=role, content=_prepare_content(i, msg.get("content")))
    if not isinstance(out.get("reasoning_content"), str):
        # transformers reads reasoning from reasoning_content; clients also send `reasoning`.
        alias = next(
            (msg[k] for k in ("reasoning", "thinking") if isinstance(msg.get(k), str)), None
        )
        out["reasoning_content"] = alias
    if msg.get("tool_calls") is not None:
        out["tool_calls"] = _prepare_tool_calls(i, msg["tool_calls"])
    return out


def _prepare_content(i: int, content: Any) -> Any:
    if content is None or isinstance(content, str):
        return content
    if not isinstance(content, Sequence) or isinstance(content, (bytes, Mapping)):
        raise ChatTemplateError(
            f"messages[{i}].content must be a string, a list of content parts or null; "
            f"got {type(content).__name__}",
            param=f"messages[{i}].content",
        )
    parts: list[dict[str, Any]] = []
    for j, part in enumerate(content):
        kind = part.get("type") if isinstance(part, Mapping) else None
        if kind == "text" and isinstance(part.get("text"), str):
            parts.append({"type": "text", "text": part["text"]})
        elif kind in _IMAGE_TYPES:
            parts.append(dict(part, type="image"))
        elif kind in _VIDEO_TYPES:
            parts.append(dict(part, type="video"))
        else:
            raise ChatTemplateError(
                f"messages[{i}].content[{j}] has type {kind!r}; accepted content parts: "
                "text (with a string text), image_url, video_url",
                param=f"messages[{i}].content[{j}]",
            )
    return parts


def _prepare_tool_calls(i: int, calls: Any) -> list[dict[str, Any]]:
    if not isinstance(calls, Sequence) or isinstance(calls, (str, Mapping)):
        raise ChatTemplateError(
            f"messages[{i}].tool_calls must be a list of tool calls",
            param=f"messages[{i}].tool_calls",
        )
    out: list[dict[str, Any]] = []
    for j, call in enumerate(calls):
        where = f"messages[{i}].tool_calls[{j}].function"
        function = call.get("function") if isinstance(call, Mapping) else None
        if not isinstance(function, Mapping) or not isinstance(function.get("name"), str):
            raise ChatTemplateError(f"{where} must be an object with a string name", param=where)
        arguments = function.get("arguments")
        if isinstance(arguments, str):
            try:
                arguments = json.loads(arguments) if arguments.strip() else {}
            except ValueError as exc:
                raise ChatTemplateError(
                    f"{where}.arguments is not valid JSON ({exc.args[0]}): send a JSON object "
                    'encoded as a string, e.g. \'{"city": "Paris"}\'',
                    param=f"{where}.arguments",
                ) from None
        if arguments is None:
            arguments = {}
        if not isinstance(arguments, Mapping):
            raise ChatTemplateError(
                f"{where}.arguments must be a JSON object; got {type(arguments).__name__}",
                param=f"{where}.arguments",
            )
        out.append(dict(call, function=dict(function, arguments=dict(arguments))))
    return out


def _explain(
    message: str, messages: list[dict[str, Any]], kwargs: dict[str, Any]
) -> tuple[str, str | None]:
    """Turn a template's raise_exception text into a message (and param) naming what to fix."""
    if message.startswith("System message must be at the beginning"):
        idx = next((i for i, m in enumerate(messages) if i > 0 and m["role"] == "system"), "?")
        return (
            f"messages[{idx}] is a system message; only messages[0] may be one: merge it into "
            "the first message or send it as a user message"
        ), f"messages[{idx}].role"
    if message.startswith("No user query found"):
        return (
            "messages has no user message (tool results do not count): add the user's request"
        ), "messages"
    if message.startswith("No messages provided"):
        return "messages is empty: send at least one user message", "messages"
    if message.startswith("Unexpected reasoning effort"):
        return (
            f"reasoning_effort is {kwargs.get('reasoning_effort')!r}; this chat template accepts "
            f"xhigh, medium and low ({message})"
        ), "reasoning_effort"
    if message.startswith("System message cannot contain"):
        return (
            "messages[0] is a system message with an image or video: system messages take text "
            "only; move the media to a user message"
        ), "messages[0].content"
    return f"the chat template rejected the request: {message}", None
