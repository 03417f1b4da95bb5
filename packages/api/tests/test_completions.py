"""Text completions: string and token-id prompts, streaming, echo, logprobs (OpenAI client)."""

from __future__ import annotations

import httpx
import openai
import pytest

from .conftest import RunningServer


@pytest.fixture(scope="module")
def client(server: RunningServer) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.v1, api_key="unused")


@pytest.fixture(scope="module")
def model(client: openai.OpenAI) -> str:
    return client.models.list().data[0].id


def test_string_prompt(server: RunningServer, client: openai.OpenAI, model: str) -> None:
    prompt = "Once upon a time"
    r = client.completions.create(model=model, prompt=prompt, max_tokens=4, seed=1)
    assert r.choices[0].finish_reason == "length"
    num_prompt = len(server.app.state.server.tokenizer.encode(prompt))  # type: ignore[attr-defined]
    assert r.usage is not None and (r.usage.prompt_tokens, r.usage.completion_tokens) == (
        num_prompt,
        4,
    )


def test_token_id_prompt_matches_text_prompt(
    server: RunningServer, client: openai.OpenAI, model: str
) -> None:
    ids = httpx.post(server.v1 + "/tokenize", json={"prompt": "Once upon a time"}).json()["tokens"]
    by_ids = client.completions.create(model=model, prompt=ids, max_tokens=4, temperature=0)
    by_text = client.completions.create(
        model=model, prompt="Once upon a time", max_tokens=4, temperature=0
    )
    assert by_ids.choices[0].text == by_text.choices[0].text


def test_stream_with_usage_and_logprobs(client: openai.OpenAI, model: str) -> None:
    chunks = list(
        client.completions.create(
            model=model,
            prompt="Hello",
            max_tokens=3,
            stream=True,
            logprobs=2,
            stream_options={"include_usage": True},
            extra_body={"ignore_eos": True},  # a trained model may end its answer early
        )
    )
    text_chunks = [c for c in chunks if c.choices]
    assert text_chunks[-1].choices[0].finish_reason == "length"
    assert sum(len(c.choices[0].logprobs.tokens) for c in text_chunks if c.choices[0].logprobs) == 3
    assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens == 3


def test_echo_and_batch_of_prompts(client: openai.OpenAI, model: str) -> None:
    r = client.completions.create(
        model=model, prompt=["Hi", "Bye"], max_tokens=2, echo=True,
        extra_body={"ignore_eos": True},
    )  # fmt: skip
    assert [c.text[:2] for c in r.choices] == ["Hi", "By"]
    assert r.usage is not None and r.usage.completion_tokens == 4


def test_usage_with_several_prompts_and_choices(client: openai.OpenAI, model: str) -> None:
    r = client.completions.create(model=model, prompt=[[1, 2, 3], [4, 5]], n=2, max_tokens=2)
    assert len(r.choices) == 4 and r.usage is not None
    assert (r.usage.prompt_tokens, r.usage.completion_tokens, r.usage.total_tokens) == (5, 8, 13)


@pytest.mark.parametrize("prompt", [[[1, -5]], [[1, 2], [3, 10**9]]])
def test_out_of_vocab_token_ids_are_400_naming_the_prompt(
    server: RunningServer, prompt: list[list[int]]
) -> None:
    resp = httpx.post(server.v1 + "/completions", json={"prompt": prompt, "max_tokens": 1})
    assert resp.status_code == 400
    err = resp.json()["error"]
    want = "prompt" if len(prompt) == 1 else "prompt[1]"
    assert (err["code"], err["param"]) == ("invalid_value", want)


@pytest.mark.parametrize("stream", [False, True])
def test_max_tokens_zero_with_echo_returns_the_scored_prompt(
    client: openai.OpenAI, model: str, stream: bool
) -> None:
    """What scoring clients (lm-eval) send: the prompt's logprobs and no new token."""
    prompt = "Once upon a time"
    kw = {"model": model, "prompt": prompt, "max_tokens": 0, "echo": True, "logprobs": 1}
    if stream:
        chunks = list(client.completions.create(**kw, stream=True))
        text = "".join(c.choices[0].text for c in chunks if c.choices)
        finish = [c.choices[0].finish_reason for c in chunks if c.choices][-1]
        tokens = [
            t
            for c in chunks
            if c.choices and c.choices[0].logprobs
            for t in c.choices[0].logprobs.tokens or []
        ]
    else:
        r = client.completions.create(**kw)
        text, finish = r.choices[0].text, r.choices[0].finish_reason
        assert r.usage is not None and r.usage.completion_tokens == 0
        assert r.choices[0].logprobs is not None
        tokens = r.choices[0].logprobs.tokens or []
    assert (text, finish) == (prompt, "length")
    assert "".join(tokens) == prompt


def test_max_tokens_zero_needs_echo(server: RunningServer) -> None:
    body = {"prompt": "hi", "max_tokens": 0}
    resp = httpx.post(server.v1 + "/completions", json=body, timeout=60)
    assert resp.status_code == 400 and "max_tokens 0 needs echo" in resp.json()["error"]["message"]


def test_omitted_max_tokens_is_16(client: openai.OpenAI, model: str) -> None:
    """OpenAI's and vLLM's default on this endpoint, not the rest of the context window."""
    r = client.completions.create(model=model, prompt="def f(", extra_body={"ignore_eos": True})
    assert r.choices[0].finish_reason == "length"
    assert r.usage is not None and r.usage.completion_tokens == 16


@pytest.mark.parametrize("stream", [False, True])
def test_logprobs_zero_has_the_sampled_token(
    client: openai.OpenAI, model: str, stream: bool
) -> None:
    kw = {"model": model, "prompt": "Hello", "max_tokens": 3, "logprobs": 0, "seed": 3}
    if stream:
        chunks = list(client.completions.create(**kw, stream=True))
        lps = [c.choices[0].logprobs for c in chunks if c.choices and c.choices[0].logprobs]
    else:
        lps = [client.completions.create(**kw).choices[0].logprobs]
    tokens = [t for lp in lps for t in lp.tokens or []]
    tops = [t for lp in lps for t in lp.top_logprobs or []]
    logprobs = [x for lp in lps for x in lp.token_logprobs or []]
    assert tokens and len(tops) == len(tokens)
    for token, top, logprob in zip(tokens, tops, logprobs, strict=True):
        assert top == {token: logprob}


@pytest.mark.parametrize("path", ["/completions", "/chat/completions"])
def test_stream_options_without_stream_is_400(server: RunningServer, path: str) -> None:
    body = {"max_tokens": 1, "stream_options": {"include_usage": True}}
    body |= (
        {"prompt": "hi"}
        if path == "/completions"
        else {"messages": [{"role": "user", "content": "hi"}]}
    )
    resp = httpx.post(server.v1 + path, json=body, timeout=60)
    assert resp.status_code == 400
    assert resp.json()["error"]["param"] == "stream_options"
    client = openai.OpenAI(base_url=server.v1, api_key="unused")
    with pytest.raises(openai.BadRequestError, match="stream_options"):
        client.completions.create(
            model="x", prompt="hi", max_tokens=1, stream_options={"include_usage": True}
        )
