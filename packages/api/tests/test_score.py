"""`/v1/score` and echo + logprobs against a direct forward of the embedded model."""

from __future__ import annotations

import time

import httpx
import openai
import pytest
import torch
from sparkinfer.model.cache_spec import allocate_caches
from sparkinfer.model.forward_batch import ForwardBatch

from .conftest import RunningServer, serve

PROMPT = "The capital of France is"
COMPLETION = " Paris, of course."


@pytest.fixture(scope="module")
def model(server: RunningServer) -> str:
    return httpx.get(server.v1 + "/models").json()["data"][0]["id"]


def _score(server: RunningServer, body: dict) -> httpx.Response:
    return httpx.post(server.v1 + "/score", json=body, timeout=60)


def _direct_logprobs(server: RunningServer, ids: list[int]) -> torch.Tensor:
    """log_softmax of one plain forward over `ids` (no engine): row i scores token i + 1."""
    net = server.app.state.server.engine.engine.runner.model  # type: ignore[attr-defined]
    block_size = 64
    num_blocks = -(-len(ids) // block_size)
    caches = allocate_caches(
        net.cache_spec(), num_blocks=num_blocks, block_size=block_size, num_slots=1, device="cpu"
    )
    batch = ForwardBatch.build(
        [len(ids)], [0], [list(range(num_blocks))], [0],
        caches=caches, block_size=block_size, device="cpu",
    )  # fmt: skip
    with torch.inference_mode():
        logits = net.compute_logits(net(torch.tensor(ids), batch))
    return torch.log_softmax(logits[:-1], dim=-1)


def test_score_matches_a_direct_forward(server: RunningServer, model: str) -> None:
    body = {"model": model, "prompt": PROMPT, "completion": COMPLETION, "top_logprobs": 2}
    resp = _score(server, body)
    assert resp.status_code == 200, resp.text
    got = resp.json()
    tok = server.app.state.server.tokenizer  # type: ignore[attr-defined]
    context = tok.encode(PROMPT, allow_special=True)
    completion = tok.encode(COMPLETION, allow_special=True)
    assert got["token_ids"] == completion and "".join(got["tokens"]) == COMPLETION
    want = _direct_logprobs(server, context + completion)[len(context) - 1 :]
    chosen = want.gather(1, torch.tensor(completion).unsqueeze(1)).squeeze(1)
    torch.testing.assert_close(torch.tensor(got["token_logprobs"]), chosen, atol=1e-3, rtol=0)
    assert got["logprob"] == pytest.approx(sum(got["token_logprobs"]))
    best = want.max(dim=-1)
    assert got["is_greedy"] == bool((chosen >= best.values).all())
    assert [len(t) for t in got["top_logprobs"]] == [2] * len(completion)
    first_top = max(got["top_logprobs"][0].values())
    assert first_top == pytest.approx(best.values[0].item(), abs=1e-3)
    usage = got["usage"]
    assert (usage["prompt_tokens"], usage["completion_tokens"]) == (len(context + completion), 0)
    assert got["id"].startswith("score-") and got["object"] == "score"


def test_score_after_chat_messages_equals_the_rendered_ids(
    server: RunningServer, model: str
) -> None:
    messages = [{"role": "user", "content": "Name a colour."}]
    ids = httpx.post(
        server.v1 + "/tokenize", json={"messages": messages, "add_generation_prompt": True}
    ).json()["tokens"]
    by_chat = _score(server, {"model": model, "messages": messages, "completion": "Blue."}).json()
    by_ids = _score(server, {"model": model, "prompt": ids, "completion": "Blue."}).json()
    assert by_chat["token_ids"] == by_ids["token_ids"]
    assert by_chat["token_logprobs"] == pytest.approx(by_ids["token_logprobs"], abs=1e-4)
    assert by_chat["top_logprobs"] is None


@pytest.mark.parametrize(
    ("patch", "param", "code"),
    [
        ({"messages": [{"role": "user", "content": "x"}]}, None, "invalid_value"),
        ({"completion": ""}, "completion", "invalid_value"),
        ({"completion": [1] * 1100}, "prompt plus completion", "context_length_exceeded"),
        ({"completion": [10**9]}, "completion", "invalid_value"),
    ],
)
def test_score_refuses_bad_input(
    server: RunningServer, model: str, patch: dict, param: str | None, code: str
) -> None:
    resp = _score(server, {"model": model, "prompt": PROMPT, "completion": "x", **patch})
    assert resp.status_code == 400
    err = resp.json()["error"]
    assert err["code"] == code
    if param is not None:
        assert param.split()[0] in err["message"]


def test_echo_with_logprobs_scores_the_prompt(server: RunningServer, model: str) -> None:
    client = openai.OpenAI(base_url=server.v1, api_key="unused")
    tok = server.app.state.server.tokenizer  # type: ignore[attr-defined]
    ids = tok.encode(PROMPT + COMPLETION, allow_special=True)
    args = {"model": model, "prompt": ids, "max_tokens": 2, "echo": True, "logprobs": 1,
            "extra_body": {"ignore_eos": True}}  # fmt: skip
    lp = client.completions.create(**args, temperature=0).choices[0].logprobs
    assert lp is not None and lp.token_logprobs is not None and lp.tokens is not None
    assert len(lp.tokens) == len(ids) + 2
    assert lp.token_logprobs[0] is None and lp.top_logprobs and lp.top_logprobs[0] is None
    scored = _score(server, {"model": model, "prompt": ids[:1], "completion": ids[1:]}).json()
    assert lp.token_logprobs[1 : len(ids)] == pytest.approx(scored["token_logprobs"], abs=1e-4)
    chunks = list(client.completions.create(**args, stream=True))
    first = chunks[0].choices[0]
    assert first.text == tok.decode(ids) and first.logprobs is not None
    assert first.logprobs.token_logprobs is not None
    assert first.logprobs.token_logprobs[1:] == pytest.approx(scored["token_logprobs"], abs=1e-4)


def test_client_disconnect_aborts_the_score_request() -> None:
    with serve(max_num_seqs=1) as small:
        stats = small.app.state.server.engine.engine.stats  # type: ignore[attr-defined]
        model = httpx.get(small.v1 + "/models").json()["data"][0]["id"]
        # A streamed completion holds the only sequence, so the score request has to wait.
        blocker = {"model": model, "prompt": "a", "max_tokens": 900, "ignore_eos": True}
        with httpx.stream(
            "POST", small.v1 + "/completions", json={**blocker, "stream": True}, timeout=60
        ) as resp:
            lines = resp.iter_lines()  # kept: a dropped iterator closes the stream
            next(lines)
            body = {"model": model, "prompt": PROMPT, "completion": COMPLETION}
            with pytest.raises(httpx.ReadTimeout):  # the client gives up while it waits
                httpx.post(small.v1 + "/score", json=body, timeout=1)
            for _ in range(200):
                now = stats()
                if now.num_aborted == 1 and now.num_waiting == 0:
                    break
                time.sleep(0.05)
            assert (now.num_aborted, now.num_waiting, now.num_running) == (1, 0, 1)
