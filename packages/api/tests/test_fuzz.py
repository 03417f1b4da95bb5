"""Untrusted input, fuzzed: valid bodies of every POST endpoint with random fields replaced,
dropped or added, sent to the real server. Each answer is a success or an OpenAI-style 4xx
error, never a 5xx, and the server answers a plain request afterwards."""

from __future__ import annotations

import copy
import json
import random
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from .conftest import RunningServer

USER = [{"role": "user", "content": "hi"}]
TOOL = {
    "type": "function",
    "function": {
        "name": "get",
        "parameters": {"type": "object", "properties": {"q": {"type": "string"}}},
    },
}
# Small max_tokens everywhere: a mutation that keeps a body valid still answers quickly.
VALID = {
    "/chat/completions": {
        "messages": [
            {"role": "system", "content": "be brief"},
            {"role": "user", "content": [{"type": "text", "text": "hi"}]},
        ],
        "max_tokens": 2,
        "temperature": 0.7,
        "top_p": 0.9,
        "top_k": 5,
        "stop": ["\n"],
        "seed": 1,
        "logprobs": True,
        "top_logprobs": 2,
        "tools": [TOOL],
        "tool_choice": "auto",
        "logit_bias": {"5": 1.0},
        "presence_penalty": 0.1,
    },
    "/completions": {
        "prompt": "hello",
        "max_tokens": 2,
        "logprobs": 2,
        "echo": False,
        "stop": "x",
        "frequency_penalty": 0.2,
        "n": 1,
    },
    "/tokenize": {"prompt": "hello"},
    "/detokenize": {"tokens": [1, 2, 3]},
    "/score": {"prompt": "hello", "completion": " world", "top_logprobs": 2},
}
# Values that break types, ranges, encodings and nesting; no mid-size positive integer, so a
# mutated max_tokens never asks for a long generation.
JUNK: list[Any] = [
    None, True, -1, 0, 2**31, 2**63, 10**30, -(10**30), 1e308, -0.0, 0.5, "", "x" * 5000,
    "\ud800", "\u0000", "é🙂", [], [None], [[]], [1, "a", None], {}, {"": None},
    {"type": None}, {"role": 7, "content": {}}, [{"role": "user", "content": None}],
    [{"type": "image_url", "image_url": {"url": "data:image/png;base64,!!"}}],
    [{"type": "text"}], {"nested": {"deeper": [{"deepest": [[[]]]}]}},
]  # fmt: skip
CASES_PER_ENDPOINT = 60


def _paths(body: Any, prefix: tuple = ()) -> Iterator[tuple]:
    """Every path to a value in body (dict keys and list indices)."""
    if isinstance(body, dict):
        items: Any = body.items()
    elif isinstance(body, list):
        items = enumerate(body)
    else:
        return
    for key, value in items:
        yield (*prefix, key)
        yield from _paths(value, (*prefix, key))


def _mutate(body: dict, rng: random.Random) -> dict:
    """1-3 random edits: a value replaced by junk, a key dropped, an unknown key added."""
    out = copy.deepcopy(body)
    for _ in range(rng.randint(1, 3)):
        paths = list(_paths(out))
        action = rng.random()
        if not paths or action < 0.15:
            out[rng.choice(["extra", "stream", "n", "model", "max_tokens"])] = rng.choice(JUNK)
            continue
        path = rng.choice(paths)
        parent = out
        for key in path[:-1]:
            parent = parent[key]
        if action < 0.3:
            del parent[path[-1]]
        else:
            parent[path[-1]] = copy.deepcopy(rng.choice(JUNK))
    return out


def _check_answer(resp: httpx.Response, body: dict) -> None:
    sent = json.dumps(body, ensure_ascii=True)[:300]
    assert resp.status_code < 500, f"{resp.status_code} for {sent}: {resp.text[:300]}"
    if resp.status_code >= 400:
        error = resp.json()["error"]
        assert set(error) == {"message", "type", "param", "code"}, resp.text[:300]
        assert error["message"], sent
    elif resp.headers.get("content-type", "").startswith("text/event-stream"):
        events = [line for line in resp.text.splitlines() if line.startswith("data: ")]
        assert events and events[-1] == "data: [DONE]", f"{sent}: {resp.text[-300:]}"


STREAMED = ("/chat/completions", "/completions")


@pytest.mark.parametrize(
    ("path", "stream"),
    [(p, False) for p in VALID] + [(p, True) for p in STREAMED],
    ids=[*VALID, *(f"{p} stream" for p in STREAMED)],
)
def test_fuzzed_bodies_get_a_4xx_or_an_answer(
    server: RunningServer, path: str, stream: bool
) -> None:
    rng = random.Random(f"fuzz {path} {stream}")
    streamed = {"stream": True, "stream_options": {"include_usage": True}}
    valid = VALID[path] | (streamed if stream else {})
    with httpx.Client(base_url=server.v1, timeout=60) as client:
        for _ in range(CASES_PER_ENDPOINT):
            body = _mutate(valid, rng)
            # Lone surrogates and NaN are not valid JSON for every encoder: send the bytes.
            content = json.dumps(body, ensure_ascii=True, allow_nan=True).encode()
            resp = client.post(path, content=content, headers={"content-type": "application/json"})
            _check_answer(resp, body)
        ok = client.post(path, json=valid)
        assert ok.status_code == 200, ok.text[:300]
        _check_answer(ok, valid)


def test_bodies_that_are_not_objects_are_400(server: RunningServer) -> None:
    with httpx.Client(base_url=server.v1, timeout=60) as client:
        for raw in (b"[]", b"null", b"1", b'"x"', b"{", b"\xff\xfe", b"", b'{"a": NaN}'):
            for path in VALID:
                resp = client.post(path, content=raw, headers={"content-type": "application/json"})
                assert 400 <= resp.status_code < 500, (path, raw, resp.status_code, resp.text)
                assert set(resp.json()["error"]) == {"message", "type", "param", "code"}
