"""Constrained decoding with xgrammar: tool calls and JSON output, as a logits processor.

The grammar follows Qwen's XML tool-call format exactly as the chat template shows it (one `\\n`
where the template has one), so every sampled call parses and validates; a string parameter's
`pattern` and `maxLength` hold inside the call, so a bounded schema closes within a bounded
number of tokens whatever the weights. With thinking on, the output first runs free inside the
reasoning block (bounded by `reasoning_budget` tokens, after which `</think>` is forced), then the
constrained part starts. Under tool_choice auto the answer is free text until it opens
`<tool_call>`; from there the call is held to the declared tools and their schemas.
"""

from __future__ import annotations

import asyncio
import logging
import re
import threading
from collections import OrderedDict
from collections.abc import Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, cast

import torch
import xgrammar as xgr
from sparkinfer.api.grammar_pool import CompileFailed, CompilePool
from sparkinfer.model.tokenizer import Tokenizer
from xgrammar.structural_tag import (
    AnyTextFormat,
    ConstStringFormat,
    Format,
    JSONSchemaFormat,
    OptionalFormat,
    OrFormat,
    RegexFormat,
    SequenceFormat,
    StructuralTag,
    TagFormat,
    TagsWithSeparatorFormat,
    TriggeredTagsFormat,
)

logger = logging.getLogger("sparkinfer.api")
_MAX_WS = 1  # JSON whitespace runs: bounded so that sampling cannot wander off in blanks
_MAX_REGEX_MIN_LENGTH = 8  # a string's minLength up to this is enforced by the grammar
_THINK_MARKERS = ["<think>", "</think>"]
TOOL_CALL_TRIGGER = "<tool_call>"
_SOURCE_LOCATION = re.compile(r"^\[[\d:]+\] \S+:\d+: ")  # xgrammar's "[12:00:00] file.cc:42: "


class UnsupportedSchema(ValueError):
    """A JSON Schema that passes the metaschema but cannot become a grammar (e.g. min > max)."""


class GrammarTimeout(ValueError):
    """A grammar took longer than its deadline to compile (its compile was stopped)."""


class GrammarCompiler:
    """Compiles grammars for one tokenizer and model vocabulary (thread-safe, cached).

    Identical tool sets and response formats repeat across requests, and an xgrammar compile is
    expensive, so the last `cache_size` compiled grammars are kept, keyed by the tag's JSON.
    Grammars built from client schemas compile in processes of their own (`compile_isolated`:
    `num_workers` at once, `per_client` per client, each killed at its deadline); the server's
    own small grammars compile on `num_threads` threads of their own (`compile_in_thread`).
    Identical grammars compile once.
    """

    def __init__(
        self,
        tokenizer: Tokenizer,
        *,
        model_vocab_size: int,
        cache_size: int = 64,
        num_threads: int = 2,
        num_workers: int = 4,
        per_client: int = 2,
    ) -> None:
        if cache_size < 1:
            raise ValueError(f"cache_size is {cache_size}; it must be at least 1")
        vocab: list[bytes] = []
        for i in range(tokenizer.vocab_size):
            try:
                vocab.append(tokenizer.token_bytes(i))
            except ValueError:  # a gap in the id space: never allowed
                vocab.append(b"")
        self.vocab_size = max(model_vocab_size, tokenizer.vocab_size)
        info = xgr.TokenizerInfo(
            vocab,
            vocab_type=xgr.VocabType.RAW,
            vocab_size=self.vocab_size,
            stop_token_ids=list(tokenizer.eos_token_ids),
        )
        self._compiler = xgr.GrammarCompiler(info, max_threads=2)
        self._pool = CompilePool(info, num_workers=num_workers, per_client=per_client)
        self._isolated: dict[str, asyncio.Future[xgr.CompiledGrammar]] = {}  # event loop only
        self._executor = ThreadPoolExecutor(num_threads, thread_name_prefix="grammar")
        self._lock = threading.Lock()  # guards _cache and _pending, never held while compiling
        self._cache: OrderedDict[str, xgr.CompiledGrammar] = OrderedDict()
        self._pending: dict[str, Future[xgr.CompiledGrammar]] = {}
        self._cache_size = cache_size

    def compile(self, tag: StructuralTag) -> xgr.CompiledGrammar:
        """Compile `tag`, or reuse the grammar of an identical earlier tag (least recently used go).

        Raises `UnsupportedSchema` with xgrammar's reason when a schema in `tag` fails. Blocks for
        as long as the compile takes: from async code use `compile_in_thread`.
        """
        key = tag.model_dump_json()
        with self._lock:
            if (grammar := self._cache.get(key)) is not None:
                self._cache.move_to_end(key)
                return grammar
            pending = self._pending.get(key)
            is_owner = pending is None
            if pending is None:
                pending = self._pending[key] = Future()
        if not is_owner:  # an identical tag is compiling: wait for its grammar
            return pending.result()
        try:
            grammar = self._compile_uncached(tag)
        except BaseException as exc:
            pending.set_exception(exc)
            raise
        finally:
            with self._lock:
                del self._pending[key]
        with self._lock:
            self._cache[key] = grammar
            if len(self._cache) > self._cache_size:
                self._cache.popitem(last=False)
        pending.set_result(grammar)
        return grammar

    def _cached(self, key: str) -> xgr.CompiledGrammar | None:
        with self._lock:
            grammar = self._cache.get(key)
            if grammar is not None:
                self._cache.move_to_end(key)
            return grammar

    def _keep(self, key: str, grammar: xgr.CompiledGrammar) -> None:
        with self._lock:
            self._cache[key] = grammar
            if len(self._cache) > self._cache_size:
                self._cache.popitem(last=False)

    async def compile_isolated(
        self, tag: StructuralTag, *, client: str, timeout_s: float | None
    ) -> xgr.CompiledGrammar:
        """Compile a grammar built from a client's schema in a process of its own, stopped at
        `timeout_s` (`GrammarTimeout`; waiting for a free slot counts); `UnsupportedSchema`
        with xgrammar's reason when it refuses the schema."""
        key = tag.model_dump_json()
        if (grammar := self._cached(key)) is not None:
            return grammar
        pending = self._isolated.get(key)
        if pending is None:  # an identical tag compiling for another request is shared
            pending = asyncio.ensure_future(
                self._pool.compile(tag, client=client, timeout_s=timeout_s)
            )
            self._isolated[key] = pending
            pending.add_done_callback(lambda _: self._isolated.pop(key, None))
        try:
            grammar = await asyncio.wait_for(asyncio.shield(pending), timeout_s)
        except TimeoutError:
            raise GrammarTimeout(f"it took longer than {timeout_s:g} s to compile") from None
        except CompileFailed as exc:
            reason = _SOURCE_LOCATION.sub("", str(exc).strip().splitlines()[-1])
            raise UnsupportedSchema(reason) from None
        self._keep(key, grammar)
        return grammar

    def close(self) -> None:
        """Stop the compile threads (running compile processes are killed at their deadline)."""
        self._executor.shutdown(wait=False, cancel_futures=True)
        self._pool.close()

    def _compile_uncached(self, tag: StructuralTag) -> xgr.CompiledGrammar:
        try:
            return self._compiler.compile_structural_tag(tag)
        except RuntimeError as exc:
            reason = _SOURCE_LOCATION.sub("", str(exc).strip().splitlines()[-1])
            raise UnsupportedSchema(reason) from exc

    async def compile_in_thread(
        self, tag: StructuralTag, *, timeout_s: float | None = None
    ) -> xgr.CompiledGrammar:
        """`compile` on the compiler's own threads; `GrammarTimeout` after `timeout_s` seconds
        (the compile still finishes there, and its grammar is cached for the next request)."""
        loop = asyncio.get_running_loop()
        pending = loop.run_in_executor(self._executor, self.compile, tag)
        try:
            return await asyncio.wait_for(asyncio.shield(pending), timeout_s)
        except TimeoutError:
            raise GrammarTimeout(f"it took longer than {timeout_s:g} s to compile") from None

    def processor(self, grammar: xgr.CompiledGrammar) -> GrammarLogitsProcessor:
        """A fresh logits processor (its own matcher) for one sequence."""
        return GrammarLogitsProcessor(grammar, self.vocab_size)


class GrammarLogitsProcessor:
    """Masks the logits of one sequence to the tokens its grammar allows next.

    Called by the engine's sampler with the tokens before a position (those generated so far,
    and at a speculative verify row the drafts before it) and that position's `[V]` (or `[1, V]`)
    logits. Successive histories need not extend each other: a verify hands over its drafts row
    by row, and the next step's history keeps only those accepted. The matcher rolls back to the
    longest prefix it shares with the history, then accepts the rest. A history holding a token
    the grammar refuses gets no mask: past a refused draft no row is accepted (the row before it
    was masked, so its draw never equals that draft), and a refused token that was emitted
    leaves the sequence unconstrained (its output is still checked against its schema at the
    end).
    """

    def __init__(self, grammar: xgr.CompiledGrammar, vocab_size: int) -> None:
        self._matcher = xgr.GrammarMatcher(grammar)  # rolls back any number of tokens
        self._bitmask = xgr.allocate_token_bitmask(1, vocab_size)
        self._vocab_size = vocab_size
        self._accepted: list[int] = []  # the tokens the matcher has taken, in order
        self.is_broken = False  # the matcher failed: stop masking

    def __call__(self, output_token_ids: Sequence[int], logits: torch.Tensor) -> torch.Tensor:
        if self.is_broken:
            return logits
        try:
            return self._mask(output_token_ids, logits)
        except Exception:  # the engine step is shared: only this sequence loses its grammar
            logger.exception("grammar matcher failed; the sequence is no longer constrained")
            self.is_broken = True  # its output is still checked against its schema at the end
            return logits

    def _mask(self, history: Sequence[int], logits: torch.Tensor) -> torch.Tensor:
        if not self._follow(history):
            return logits
        # Ended (its stop token accepted): the engine may draw once more for the request before
        # its scheduler sees that token, and discards that draw.
        if self._matcher.is_terminated():
            return logits
        self._matcher.fill_next_token_bitmask(self._bitmask)
        rows = logits.view(1, -1)
        bitmask = self._bitmask.to(rows.device, non_blocking=True)
        xgr.apply_token_bitmask_inplace(rows, bitmask, vocab_size=self._vocab_size)
        return logits

    def _follow(self, history: Sequence[int]) -> bool:
        """Bring the matcher to the end of `history`; False where the grammar refuses a token
        of it (the matcher then stands right before that token)."""
        accepted = self._accepted
        shared = _shared_prefix_len(accepted, history)
        if shared < len(accepted):
            self._matcher.rollback(len(accepted) - shared)
            del accepted[shared:]
        for token_id in history[shared:]:
            if not self._matcher.accept_token(token_id):
                return False
            accepted.append(token_id)
        return True


def _shared_prefix_len(a: Sequence[int], b: Sequence[int]) -> int:
    """How many leading tokens a and b share."""
    n = min(len(a), len(b))
    if list(a[:n]) == list(b[:n]):  # the usual case: one extends the other
        return n
    return next(i for i in range(n) if a[i] != b[i])


def _reasoning_prefix(budget: int | None, excludes: Sequence[str] = ()) -> list[Any]:
    """The reasoning block that the prompt opened with `<think>\\n`, closed by `</think>\\n\\n`
    (`excludes`: more text it may not hold)."""
    text = AnyTextFormat(excludes=[*_THINK_MARKERS, *excludes], max_tokens=budget)
    think = TagFormat(begin="", content=text, end="</think>")
    return [think, ConstStringFormat(value="\n\n")]


def _object(value: Any) -> dict[str, Any] | None:
    """A schema node as a JSON object, or None when it is not one."""
    return cast("dict[str, Any]", value) if isinstance(value, dict) else None


def _with_defs(sub: Any, root: dict[str, Any]) -> Any:
    """A property's schema with the root's `$defs`/`definitions`, so local `$ref`s resolve."""
    node = _object(sub)
    if node is None:
        return sub
    extra = {k: root[k] for k in ("$defs", "definitions") if k in root and k not in node}
    return {**node, **extra}


def _resolve(sub: Any, root: dict[str, Any]) -> Any:
    """Follow a property's local `$ref` chain (`#/$defs/...`) to the schema it names."""
    for _ in range(16):  # a longer chain is a cycle: keep the $ref for the JSON grammar
        node = _object(sub)
        ref = node.get("$ref") if node is not None else None
        if not isinstance(ref, str) or not ref.startswith("#/"):
            return sub
        target: Any = root
        for part in ref[2:].split("/"):
            target = target.get(part.replace("~1", "/").replace("~0", "~"), {})
        sub = target
    return sub


def _parameter(name: str, sub: Any, root: dict[str, Any]) -> Any:
    """`<parameter=NAME>\\nVALUE\\n</parameter>\\n`: raw text for strings, JSON otherwise."""
    begin, end = f"<parameter={name}>\n", "\n</parameter>\n"
    sub = _resolve(sub, root)
    node = _object(sub)
    if node is not None and node.get("type") == "string":
        values: list[Any] | None = node.get("enum") or (
            [node["const"]] if "const" in node else None
        )
        if values and all(isinstance(v, str) for v in values):
            options: list[Format] = [ConstStringFormat(value=f"{begin}{v}{end}") for v in values]
            return options[0] if len(options) == 1 else OrFormat(elements=options)
        return TagFormat(begin=begin, content=_string_value(node, end.strip()), end=end)
    schema = _with_defs(sub, root) if sub is not None else True
    content = JSONSchemaFormat(json_schema=schema, style="json", max_whitespace_cnt=_MAX_WS)
    return TagFormat(begin=begin, content=content, end=end)


def _string_value(node: dict[str, Any], end: str) -> Format:
    """A string parameter's raw text: its `pattern` (anchored), else at most `maxLength`
    characters (a short `minLength` too), else free text up to the closing tag.

    Large repeat counts are costly as regular expressions (64 exact repeats take seconds to
    compile), so length bounds become a character budget and only a short minimum a regex; what
    the grammar leaves open the schema check after the call still decides.
    """
    pattern = node.get("pattern")
    if isinstance(pattern, str):
        return RegexFormat(pattern=pattern.removeprefix("^").removesuffix("$"))
    low, high = node.get("minLength"), node.get("maxLength")
    low = low if isinstance(low, int) and 0 < low <= _MAX_REGEX_MIN_LENGTH else 0
    high = high if isinstance(high, int) and high >= low else None
    rest = AnyTextFormat(excludes=[end], max_chars=None if high is None else high - low)
    if not low:
        return rest
    return SequenceFormat(elements=[RegexFormat(pattern=f"[\\s\\S]{{{low}}}"), rest])


def _arguments(schema: dict[str, Any] | None) -> Any:
    """The parameters of one call in the schema's property order; optional ones may be left out."""
    props = (schema or {}).get("properties")
    if not isinstance(props, dict) or not props:
        loose = schema if schema else {"type": "object"}
        return JSONSchemaFormat(json_schema=loose, style="qwen_xml", max_whitespace_cnt=_MAX_WS)
    required = set((schema or {}).get("required") or [])
    parts: list[Any] = []
    for name, sub in cast("dict[str, Any]", props).items():
        part = _parameter(name, sub, schema or {})
        parts.append(part if name in required else OptionalFormat(content=part))
    return parts[0] if len(parts) == 1 else SequenceFormat(elements=parts)


def _call(name: str, schema: dict[str, Any] | None) -> TagFormat:
    return TagFormat(
        begin=f"<tool_call>\n<function={name}>\n",
        content=_arguments(schema),
        end="</function>\n</tool_call>",
    )


def tool_call_grammar(
    tools: Sequence[tuple[str, dict[str, Any] | None]],
    *,
    is_parallel: bool,
    is_thinking: bool,
    reasoning_budget: int | None,
) -> StructuralTag:
    """One or more calls of the given (name, parameters) tools and nothing else."""
    calls = TagsWithSeparatorFormat(
        tags=[_call(name, schema) for name, schema in tools],
        separator="\n",
        at_least_one=True,
        stop_after_first=not is_parallel,
    )
    if not is_thinking:
        return StructuralTag(format=calls)
    return StructuralTag(
        format=SequenceFormat(elements=[*_reasoning_prefix(reasoning_budget), calls])
    )


def auto_tool_grammar(
    tools: Sequence[tuple[str, dict[str, Any] | None]],
    *,
    is_parallel: bool,
    is_thinking: bool,
    reasoning_budget: int | None,
) -> StructuralTag:
    """Free text, in which `<tool_call>` opens a call that must be one of the given tools with
    valid arguments (tool_choice auto): a call is well formed or not written at all."""
    calls = TriggeredTagsFormat(
        triggers=[TOOL_CALL_TRIGGER],
        tags=[_call(name, schema) for name, schema in tools],
        at_least_one=False,
        stop_after_first=not is_parallel,
    )
    if not is_thinking:
        return StructuralTag(format=calls)
    # `<tool_call>` inside the reasoning would end it (reasoning_parser): calls come after it.
    prefix = _reasoning_prefix(reasoning_budget, excludes=[TOOL_CALL_TRIGGER])
    return StructuralTag(format=SequenceFormat(elements=[*prefix, calls]))


def json_grammar(
    schema: dict[str, Any] | bool, *, is_thinking: bool, reasoning_budget: int | None
) -> StructuralTag:
    """A JSON value matching `schema` (json_object: `{"type": "object"}`)."""
    body = JSONSchemaFormat(json_schema=schema, style="json", max_whitespace_cnt=_MAX_WS)
    if not is_thinking:
        return StructuralTag(format=body)
    return StructuralTag(
        format=SequenceFormat(elements=[*_reasoning_prefix(reasoning_budget), body])
    )


def reasoning_grammar(budget: int) -> StructuralTag:
    """Free output whose reasoning block ends after at most `budget` tokens."""
    rest = AnyTextFormat(excludes=_THINK_MARKERS)
    return StructuralTag(format=SequenceFormat(elements=[*_reasoning_prefix(budget), rest]))
