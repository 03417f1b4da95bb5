"""GrammarCompiler: compiled grammars are cached, and compiles run off the event loop."""

from __future__ import annotations

import threading
import uuid
from typing import Any

import httpx
import pytest
import xgrammar as xgr
from sparkinfer.api.grammar import GrammarCompiler, UnsupportedSchema, json_grammar
from sparkinfer.model.tokenizer import Tokenizer
from xgrammar.structural_tag import StructuralTag

from .conftest import RunningServer


class CountingCompiler:
    """Wraps xgrammar's compiler, counting compiles and optionally holding each one."""

    def __init__(self, inner: xgr.GrammarCompiler, *, release: threading.Event | None = None):
        self.inner = inner
        self.num_compiles = 0
        self.started = threading.Event()
        self.release = release

    def compile_structural_tag(self, tag: StructuralTag) -> xgr.CompiledGrammar:
        self.num_compiles += 1
        self.started.set()
        if self.release is not None:
            assert self.release.wait(30), "the test never released the compile"
        return self.inner.compile_structural_tag(tag)


@pytest.fixture(scope="module")
def tokenizer() -> Tokenizer:
    return Tokenizer.embedded()


def _object_with(name: str) -> StructuralTag:
    schema: dict[str, Any] = {"type": "object", "properties": {name: {"type": "integer"}}}
    return json_grammar(schema, is_thinking=False, reasoning_budget=None)


def _counting(grammars: GrammarCompiler) -> CountingCompiler:
    counter = CountingCompiler(grammars._compiler)
    grammars._compiler = counter  # type: ignore[assignment]
    return counter


def test_identical_schemas_compile_once(tokenizer: Tokenizer) -> None:
    grammars = GrammarCompiler(tokenizer, model_vocab_size=tokenizer.vocab_size)
    counter = _counting(grammars)
    first = grammars.compile(_object_with("a"))
    assert grammars.compile(_object_with("a")) is first
    assert counter.num_compiles == 1
    grammars.compile(_object_with("b"))
    assert counter.num_compiles == 2


def test_cache_drops_the_least_recently_used(tokenizer: Tokenizer) -> None:
    grammars = GrammarCompiler(tokenizer, model_vocab_size=tokenizer.vocab_size, cache_size=2)
    counter = _counting(grammars)
    for name in ("a", "b", "a", "c"):  # "a" was used after "b", so "b" goes
        grammars.compile(_object_with(name))
    assert counter.num_compiles == 3
    grammars.compile(_object_with("a"))
    assert counter.num_compiles == 3
    grammars.compile(_object_with("b"))
    assert counter.num_compiles == 4


def test_unsupported_schema_is_not_cached(tokenizer: Tokenizer) -> None:
    grammars = GrammarCompiler(tokenizer, model_vocab_size=tokenizer.vocab_size)
    counter = _counting(grammars)
    empty_range = {"type": "integer", "minimum": 5, "maximum": 1}
    tag = json_grammar(empty_range, is_thinking=False, reasoning_budget=None)
    for _ in range(2):
        with pytest.raises(UnsupportedSchema, match="minimum greater than maximum"):
            grammars.compile(tag)
    assert counter.num_compiles == 2


def test_cache_size_must_be_positive(tokenizer: Tokenizer) -> None:
    with pytest.raises(ValueError, match="cache_size is 0"):
        GrammarCompiler(tokenizer, model_vocab_size=tokenizer.vocab_size, cache_size=0)


def test_health_answers_while_a_grammar_compiles(
    server: RunningServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    grammars: GrammarCompiler = server.app.state.server.grammars  # type: ignore[attr-defined]
    release = threading.Event()
    held = CountingCompiler(grammars._compiler, release=release)
    monkeypatch.setattr(grammars, "_compiler", held)
    # A property name never seen before, so the server's cache cannot answer it.
    schema = {"type": "object", "properties": {f"p{uuid.uuid4().hex}": {"type": "integer"}}}
    fmt = {"type": "json_schema", "json_schema": {"name": "n", "schema": schema}}
    body = {"messages": [{"role": "user", "content": "hi"}], "response_format": fmt}
    responses: list[httpx.Response] = []

    def chat() -> None:
        body_with_limit = {**body, "max_tokens": 1}
        responses.append(
            httpx.post(server.v1 + "/chat/completions", json=body_with_limit, timeout=60)
        )

    thread = threading.Thread(target=chat, daemon=True)
    thread.start()
    try:
        assert held.started.wait(30), "the chat request never reached the grammar compile"
        assert httpx.get(server.base_url + "/health", timeout=10).json() == {"status": "ok"}
    finally:
        release.set()
        thread.join(60)
    assert responses[0].status_code == 200
