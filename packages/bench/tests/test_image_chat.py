"""`image-chat` against a fake chat server behind httpx.MockTransport (no sockets, no GPU)."""

import functools
import json

import httpx
import pytest
from sparkinfer.bench.__main__ import main
from sparkinfer.bench.image_chat import (
    TOLERANCE_TOKENS,
    RoundRow,
    Turn,
    gate,
    next_word_count,
)

IMAGE_TOKENS = 196


class FakeChat:
    """Counts 2 tokens per text word and IMAGE_TOKENS per image; streams 3 content deltas."""

    def __init__(self, fail_when: str | None = None) -> None:
        self.fail_when = fail_when  # "second-image": HTTP 400 for an image turn with history
        self.bodies: list[dict] = []

    def handle(self, request: httpx.Request) -> httpx.Response:
        if request.url.path == "/v1/models":
            return httpx.Response(200, json={"data": [{"id": "fake"}]})
        body = json.loads(request.content)
        self.bodies.append(body)
        parts = [_parts(m["content"]) for m in body["messages"]]
        num_images = sum(p["type"] == "image_url" for ps in parts for p in ps)
        if self.fail_when == "second-image" and num_images and len(parts) > 1:
            return httpx.Response(400, json={"error": {"message": "media refused"}})
        words = sum(len(p["text"].split()) for ps in parts for p in ps if p["type"] == "text")
        usage = {"prompt_tokens": 2 * words + IMAGE_TOKENS * num_images, "completion_tokens": 3}
        chunks: list[dict] = [
            {"choices": [{"index": 0, "delta": {"content": f" w{i}"}}]} for i in range(3)
        ]
        chunks.append({"choices": [], "usage": usage})
        sse = "".join(f"data: {json.dumps(c)}\n\n" for c in chunks) + "data: [DONE]\n\n"
        return httpx.Response(200, text=sse, headers={"content-type": "text/event-stream"})


def _parts(content: str | list[dict]) -> list[dict]:
    return [{"type": "text", "text": content}] if isinstance(content, str) else content


@pytest.fixture
def fake_chat(monkeypatch: pytest.MonkeyPatch):
    """Factory: the bench client's httpx.AsyncClient talks to a FakeChat."""

    def start(**kwargs: str) -> FakeChat:
        fake = FakeChat(**kwargs)
        transport = httpx.MockTransport(fake.handle)
        monkeypatch.setattr(httpx, "AsyncClient", functools.partial(real, transport=transport))
        return fake

    real = httpx.AsyncClient
    return start


def _argv(tmp_path, *extra: str) -> list[str]:
    return [
        "image-chat",
        "--base-url",
        "http://fake",
        "--image-size",
        "56",
        "--out",
        str(tmp_path),
        *extra,
    ]


def test_image_chat_reuses_the_image_and_sizes_text_twins(fake_chat, tmp_path, capsys):
    fake = fake_chat()
    assert main([*_argv(tmp_path), "--rounds", "2", "--max-tokens", "4"]) in (0, 1)
    report = json.loads((tmp_path / "image-chat.json").read_text())
    rounds = report["raw"]["rounds"]
    assert [r["round_idx"] for r in rounds] == [1, 2]
    for r in rounds:
        assert abs(r["text_cold"]["prompt_tokens"] - r["image_cold"]["prompt_tokens"]) <= (
            TOLERANCE_TOKENS
        )
        assert r["image_warm"]["prompt_tokens"] > r["image_cold"]["prompt_tokens"]
    image_bodies = [b for b in fake.bodies if isinstance(b["messages"][0]["content"], list)]
    urls = [b["messages"][0]["content"][0]["image_url"]["url"] for b in image_bodies]
    # warm-up, then per round a cold turn and a second turn with the same image bytes
    assert len(urls) == 5 and urls[1] == urls[2] and urls[3] == urls[4]
    assert len({urls[0], urls[1], urls[3]}) == 3
    second = image_bodies[2]["messages"]
    assert [m["role"] for m in second] == ["user", "assistant", "user"]
    assert second[1]["content"] == " w0 w1 w2"
    assert all(b["stream"] and b["stream_options"]["include_usage"] for b in fake.bodies)
    out = capsys.readouterr().out
    assert "median" in out and "gate second turn within 10% of text-only" in out
    assert (tmp_path / "image-chat.png").exists()


def test_server_error_names_the_turn(fake_chat, tmp_path, capsys):
    fake_chat(fail_when="second-image")
    assert main([*_argv(tmp_path), "--rounds", "1"]) == 2
    err = capsys.readouterr().err
    assert "round 1, image second turn failed: HTTP 400" in err and "media refused" in err


def test_bad_flags_are_usage_errors(fake_chat, tmp_path, capsys):
    fake_chat()
    assert main([*_argv(tmp_path), "--rounds", "0"]) == 2
    assert main([*_argv(tmp_path), "--endpoint", "completions"]) == 2
    err = capsys.readouterr().err
    assert "--rounds is 0" in err and "--endpoint chat" in err


def test_next_word_count_follows_the_tokenizer():
    def tokens(words: int) -> int:
        return 10 + 3 * words

    tried = [(100, tokens(100))]
    tried.append((next_word_count(tried, 160), tokens(next_word_count(tried, 160))))
    assert abs(tried[-1][1] - 160) < 10
    assert tokens(next_word_count(tried, 160)) == 160


def test_gate_compares_median_second_turns():
    def row(image_ms: float, text_ms: float) -> RoundRow:
        cold = Turn(0.5, 300, 0)
        return RoundRow(
            1, cold, Turn(image_ms / 1e3, 340, 300), cold, Turn(text_ms / 1e3, 340, 300)
        )

    assert gate([row(105, 100), row(300, 100), row(100, 100)]).is_passed
    assert not gate([row(120, 100), row(125, 100), row(90, 100)]).is_passed
    assert not gate([]).is_passed
