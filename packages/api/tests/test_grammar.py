"""GrammarCompiler: compiled grammars are cached; client schemas compile in processes that stop at
their deadline, each client within its share."""

from __future__ import annotations

import json
import threading
import time
import uuid
from pathlib import Path
from typing import Any

import httpx
import pytest
import torch
import xgrammar as xgr
from sparkinfer.api.grammar import (
    GrammarCompiler,
    UnsupportedSchema,
    json_grammar,
    tool_call_grammar,
)
from sparkinfer.model.tokenizer import Tokenizer
from xgrammar.structural_tag import StructuralTag

from .conftest import RunningServer, serve


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


def _chat_with_schema(
    server: RunningServer, schema: dict[str, Any], key: str = "unused"
) -> httpx.Response:
    fmt = {"type": "json_schema", "json_schema": {"name": "n", "schema": schema}}
    body = {"messages": [{"role": "user", "content": "hi"}], "response_format": fmt}
    return httpx.post(
        server.v1 + "/chat/completions",
        json={**body, "max_tokens": 1},
        headers={"Authorization": f"Bearer {key}"},
        timeout=60,
    )


def _slow_schema() -> dict[str, Any]:
    """A small schema whose grammar takes xgrammar well over a minute (nested bounded repeats);
    a fresh literal each call, so no cache answers it."""
    pattern = f"{uuid.uuid4().hex}([a-z0-9]{{1,128}}-){{1,128}}"
    return {"type": "object", "properties": {"x": {"type": "string", "pattern": pattern}}}


def test_slow_compiles_stop_at_their_deadline_and_leave_others_their_share(
    tmp_path: Path,
) -> None:
    keys = tmp_path / "keys.json"
    keys.write_text(json.dumps({"alice": "sk-alice", "bob": "sk-bob"}))
    with serve(api_keys_file=str(keys), grammar_compile_timeout_s=3.0) as s:
        slow: list[httpx.Response] = []

        def attack() -> None:
            slow.append(_chat_with_schema(s, _slow_schema(), key="sk-alice"))

        attackers = [threading.Thread(target=attack, daemon=True) for _ in range(4)]
        for thread in attackers:
            thread.start()
        time.sleep(0.5)  # the four compiles are running or queued
        fresh = {"type": "object", "properties": {f"p{uuid.uuid4().hex}": {"type": "integer"}}}
        assert _chat_with_schema(s, fresh, key="sk-bob").status_code == 200
        for thread in attackers:
            thread.join(60)
        assert [r.status_code for r in slow] == [400] * 4
        assert all("grammar_compile_timeout_s" in r.json()["error"]["message"] for r in slow)
        # The killed compiles left their slots: the attacker's next schema compiles too.
        again = {"type": "object", "properties": {f"q{uuid.uuid4().hex}": {"type": "integer"}}}
        assert _chat_with_schema(s, again, key="sk-alice").status_code == 200


def test_oversized_schemas_are_400_naming_them(server: RunningServer) -> None:
    big = {"type": "string", "enum": [f"v{i}" for i in range(5000)]}
    resp = _chat_with_schema(server, big)
    assert resp.status_code == 400
    err = resp.json()["error"]
    assert err["param"] == "response_format.json_schema.schema"
    assert "max_schema_nodes" in err["message"] and "5003 JSON values" in err["message"]
    tool = {"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}
    props = {f"p{i}": {"type": "integer"} for i in range(2500)}
    tools = [
        tool,
        {"type": "function", "function": {"name": "g", "parameters": {"properties": props}}},
    ]
    body = {"messages": [{"role": "user", "content": "hi"}], "tools": tools, "max_tokens": 1}
    resp = httpx.post(server.v1 + "/chat/completions", json=body, timeout=60)
    assert resp.status_code == 400
    err = resp.json()["error"]
    assert (err["code"], err["param"]) == ("invalid_tool_schema", "tools[1].function.parameters")


def _call_matcher(grammars: GrammarCompiler, props: dict[str, Any]) -> xgr.GrammarMatcher:
    schema = {"type": "object", "properties": props, "required": list(props)}
    tag = tool_call_grammar(
        [("f", schema)], is_parallel=False, is_thinking=False, reasoning_budget=None
    )
    matcher = xgr.GrammarMatcher(grammars.compile(tag))
    assert matcher.accept_string(f"<tool_call>\n<function=f>\n<parameter={next(iter(props))}>\n")
    return matcher


@pytest.mark.parametrize(
    ("prop", "good", "bad"),
    [
        ({"type": "string", "maxLength": 5}, "Paris", "Parisx"),
        ({"type": "string", "pattern": "^[A-Z]{3}$"}, "FRA", "Fr"),
        ({"type": "integer"}, "12", " "),  # no padding before the value
        ({"type": "integer"}, "12", "12  "),  # nor after it
        ({"enum": ["a", "b"]}, '"a"', "\n"),
    ],
)
def test_forced_call_strings_keep_their_bounds_and_whitespace_is_canonical(
    tokenizer: Tokenizer, prop: dict[str, Any], good: str, bad: str
) -> None:
    grammars = GrammarCompiler(tokenizer, model_vocab_size=tokenizer.vocab_size)
    assert _call_matcher(grammars, {"x": prop}).accept_string(good + "\n</parameter>\n")
    assert not _call_matcher(grammars, {"x": prop}).accept_string(bad)


def test_a_failing_matcher_never_fails_the_shared_step(
    tokenizer: Tokenizer, monkeypatch: pytest.MonkeyPatch
) -> None:
    grammars = GrammarCompiler(tokenizer, model_vocab_size=tokenizer.vocab_size)
    processor = grammars.processor(grammars.compile(_object_with("a")))

    def fail(*args: Any) -> None:
        raise RuntimeError("matcher state lost")

    monkeypatch.setattr(processor, "_matcher", type("Broken", (), {"accept_token": fail})())
    logits = torch.zeros(grammars.vocab_size)
    assert processor([1], logits) is logits  # unmasked, and no exception
    assert processor.is_broken


def test_a_verify_hands_drafts_row_by_row_and_the_matcher_rolls_back(tokenizer: Tokenizer) -> None:
    """Speculative verify rows: histories that grow by a draft, then shrink to the accepted
    ones, and one holding a draft the grammar refuses (no mask there, nothing broken). Every
    mask equals a fresh matcher's for the same history."""
    grammars = GrammarCompiler(tokenizer, model_vocab_size=tokenizer.vocab_size)
    grammar = grammars.compile(_object_with("a"))
    text = tokenizer.encode('{"a": 1234}')
    refused = tokenizer.encode("}")[0]

    def mask(processor: Any, history: list[int]) -> torch.Tensor:
        return processor(history, torch.zeros(grammars.vocab_size)).isinf()

    processor = grammars.processor(grammar)
    for n in (0, 1, 2, 3, 4, 2, 3, 5, 1, len(text) - 1, 4):
        assert torch.equal(mask(processor, text[:n]), mask(grammars.processor(grammar), text[:n]))
    assert not mask(processor, [*text[:3], refused, text[3]]).any()  # past a refused draft
    assert not processor.is_broken
    assert torch.equal(mask(processor, text[:4]), mask(grammars.processor(grammar), text[:4]))


def test_speculation_keeps_grammar_penalised_biased_and_logprob_requests_byte_identical() -> None:
    """Deterministic numerics: a JSON-schema request, one with penalties, logit bias and
    logprobs, and a seeded sampled one with a repetition penalty answer the same with the
    MTP head drafting (speculative auto, the default) as without it."""
    schema = {
        "type": "object",
        "properties": {"city": {"type": "string"}, "days": {"type": "integer"}},
        "required": ["city", "days"],
    }
    fmt = {"type": "json_schema", "json_schema": {"name": "trip", "schema": schema}}
    user = [{"role": "user", "content": "Plan a trip: which city, and how many days?"}]
    bodies = [
        {"messages": user, "response_format": fmt, "max_tokens": 48, "temperature": 0},
        {
            "messages": user, "max_tokens": 32, "temperature": 0, "presence_penalty": 0.8,
            "frequency_penalty": 0.3, "logit_bias": {"13": 5}, "logprobs": True,
            "top_logprobs": 2,
        },
        {"messages": user, "max_tokens": 32, "temperature": 0.8, "seed": 3,
         "repetition_penalty": 1.2},
    ]  # fmt: skip
    answers: dict[str, list[Any]] = {}
    num_accepted = 0
    for speculative in ("off", "auto"):
        with serve(deterministic=True, speculative=speculative, max_num_seqs=4) as running:
            answers[speculative] = [
                httpx.post(running.v1 + "/chat/completions", json=body, timeout=120).json()[
                    "choices"
                ]
                for body in bodies
            ]
            metrics = httpx.get(running.base_url + "/metrics", timeout=30).text
            line = next(
                x for x in metrics.splitlines()
                if x.startswith("sparkinfer_spec_decode_num_accepted_tokens_total ")
            )  # fmt: skip
            num_accepted = float(line.split()[1])
    assert answers["auto"] == answers["off"]
    assert num_accepted > 0  # the head's drafts were accepted


@pytest.mark.parametrize(
    ("schema", "words"),
    [
        ({"type": "string", "enum": [f"v{i}" for i in range(1001)]}, "1001 enum values"),
        ({"type": "string", "description": "d" * 300_000}, "max_schema_bytes"),
    ],
)
def test_schemas_over_the_byte_or_enum_limit_are_400(
    server: RunningServer, schema: dict[str, Any], words: str
) -> None:
    resp = _chat_with_schema(server, schema)
    assert resp.status_code == 400
    err = resp.json()["error"]
    assert err["param"] == "response_format.json_schema.schema" and words in err["message"]
