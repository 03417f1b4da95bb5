"""A tiny OpenAI-compatible fake server on 127.0.0.1 (asyncio streams in a background thread).

Tokens are whitespace words. Output words derive from a hash of the prompt, so the deterministic
fake answers the same prompt identically; the non-deterministic one adds a random word.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import random
import threading
from collections.abc import Iterator

import pytest

MODEL = "fake-model"


class FakeOpenAI:
    def __init__(
        self,
        *,
        is_deterministic: bool = True,
        is_strict: bool = False,
        token_delay_s: float = 0.0,
        fail_every: int = 0,
    ) -> None:
        self.is_deterministic = is_deterministic
        self.is_strict = is_strict  # refuses min_tokens / ignore_eos / stream_options with 400
        self.token_delay_s = token_delay_s
        self.fail_every = fail_every  # every n-th generation request gets a 500
        self.num_requests = 0
        self.bodies: list[dict] = []
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True)
        self._thread.start()
        self._server = asyncio.run_coroutine_threadsafe(
            asyncio.start_server(self._handle, "127.0.0.1", 0), self._loop
        ).result(10)
        self.port = self._server.sockets[0].getsockname()[1]

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def close(self) -> None:
        async def stop() -> None:
            self._server.close()
            await self._server.wait_closed()

        asyncio.run_coroutine_threadsafe(stop(), self._loop).result(10)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            head = await reader.readuntil(b"\r\n\r\n")
            lines = head.decode().split("\r\n")
            method, path, _ = lines[0].split(" ", 2)
            headers = {
                k.lower(): v.strip() for k, v in (ln.split(":", 1) for ln in lines[1:] if ln)
            }
            body = await reader.readexactly(int(headers.get("content-length", 0)))
            if method == "GET" and path == "/v1/models":
                await self._json(writer, 200, {"object": "list", "data": [{"id": MODEL}]})
            elif method == "POST" and path in ("/v1/completions", "/v1/chat/completions"):
                await self._generate(writer, json.loads(body), is_chat="chat" in path)
            else:
                await self._json(writer, 404, {"error": {"message": f"no route {path}"}})
        finally:
            writer.close()

    async def _json(self, writer: asyncio.StreamWriter, status: int, obj: dict) -> None:
        data = json.dumps(obj).encode()
        writer.write(
            f"HTTP/1.1 {status} X\r\nContent-Type: application/json\r\nContent-Length: {len(data)}"
            f"\r\nConnection: close\r\n\r\n".encode()
            + data
        )
        await writer.drain()

    async def _generate(self, writer: asyncio.StreamWriter, body: dict, *, is_chat: bool) -> None:
        self.bodies.append(body)
        if self.is_strict and {"min_tokens", "ignore_eos", "stream_options"} & body.keys():
            await self._json(writer, 400, {"error": {"message": "extra fields not permitted"}})
            return
        self.num_requests += 1
        if self.fail_every and self.num_requests % self.fail_every == 0:
            await self._json(writer, 500, {"error": {"message": "injected failure"}})
            return
        prompt = "\n".join(m["content"] for m in body["messages"]) if is_chat else body["prompt"]
        max_tokens = body.get("max_tokens", 16)
        num_out = max_tokens if body.get("ignore_eos") else min(max_tokens, 5)
        digest = hashlib.sha256(prompt.encode()).hexdigest()
        words = [f" w{digest[i % 60 : i % 60 + 4]}" for i in range(num_out)]
        if not self.is_deterministic:
            words[-1] = f" r{random.randrange(10**9)}"
        writer.write(
            b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nConnection: close\r\n\r\n"
        )
        for i, word in enumerate(words):
            await asyncio.sleep(self.token_delay_s)
            choice = {"index": 0, "finish_reason": "length" if i == num_out - 1 else None}
            choice |= {"delta": {"content": word}} if is_chat else {"text": word}
            writer.write(f"data: {json.dumps({'choices': [choice]})}\n\n".encode())
            await writer.drain()
        if (body.get("stream_options") or {}).get("include_usage"):
            usage = {"prompt_tokens": len(prompt.split()), "completion_tokens": num_out}
            writer.write(f"data: {json.dumps({'choices': [], 'usage': usage})}\n\n".encode())
        writer.write(b"data: [DONE]\n\n")
        await writer.drain()


@pytest.fixture
def fake_server() -> Iterator[type[FakeOpenAI]]:
    """Factory: `fake_server(is_deterministic=False)` starts one; all stop at teardown."""
    started: list[FakeOpenAI] = []

    def start(**kwargs: object) -> FakeOpenAI:
        server = FakeOpenAI(**kwargs)  # type: ignore[arg-type]
        started.append(server)
        return server

    yield start  # type: ignore[misc]
    for server in started:
        server.close()
