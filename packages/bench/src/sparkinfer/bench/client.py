"""A streaming client for any OpenAI-compatible server (ours, vLLM, SGLang), timing every chunk."""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from typing import Any, Literal

import httpx
from sparkinfer.bench.errors import ServerError

Endpoint = Literal["chat", "completions"]
_PATHS = {"chat": "/v1/chat/completions", "completions": "/v1/completions"}
# Fields vLLM's and SGLang's benchmarks send so that every request decodes exactly max_tokens.
_FIXED_LEN_FIELDS = ("min_tokens", "ignore_eos")


@dataclass(frozen=True)
class ServerTarget:
    """Where and how to send requests."""

    base_url: str
    model: str | None = None
    api_key: str | None = None
    endpoint: Endpoint = "completions"
    timeout_s: float = 600.0

    @property
    def root_url(self) -> str:
        """The base URL without a trailing slash or /v1."""
        url = self.base_url.rstrip("/")
        return url[: -len("/v1")] if url.endswith("/v1") else url


@dataclass(frozen=True)
class GenRequest:
    """One generation: a completions prompt or chat messages (a prompt alone is one user turn)."""

    prompt: str | None = None
    messages: list[dict[str, str]] | None = None
    max_tokens: int = 128
    is_fixed_len: bool = True  # ask the server to ignore EOS and emit exactly max_tokens
    temperature: float = 0.0
    seed: int | None = None


@dataclass
class RequestResult:
    """What one streamed request produced and when. Times are seconds from sending the request."""

    start_s: float = 0.0  # time.perf_counter() when sent
    text: str = ""
    prompt_tokens: int | None = None
    output_tokens: int = 0
    cached_tokens: int | None = None
    ttft_s: float | None = None
    e2e_s: float = 0.0
    chunk_times_s: list[float] = field(default_factory=list)
    finish_reason: str | None = None
    error: str | None = None

    @property
    def is_ok(self) -> bool:
        return self.error is None


class OpenAIClient:
    """Async client with one connection pool; use as `async with OpenAIClient(target) as client`."""

    def __init__(self, target: ServerTarget, *, max_connections: int = 128) -> None:
        self.target = target
        self.model = target.model or ""
        # None until a server answers; False once it refused min_tokens / ignore_eos.
        self.is_fixed_len_accepted: bool | None = None
        headers = {"Authorization": f"Bearer {target.api_key}"} if target.api_key else {}
        self._http = httpx.AsyncClient(
            base_url=target.root_url,
            headers=headers,
            timeout=httpx.Timeout(target.timeout_s, connect=10.0),
            limits=httpx.Limits(max_connections=max_connections, max_keepalive_connections=64),
        )

    async def __aenter__(self) -> OpenAIClient:
        if not self.model:
            self.model = await self.resolve_model()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self._http.aclose()

    async def resolve_model(self) -> str:
        """The first model id the server lists at /v1/models."""
        url = f"{self.target.root_url}/v1/models"
        try:
            resp = await self._http.get("/v1/models")
        except httpx.HTTPError as e:
            raise ServerError(
                f"cannot reach {url} ({type(e).__name__}: {e}): start the server or fix --base-url"
            ) from e
        if resp.status_code != 200:
            raise ServerError(f"GET {url} returned HTTP {resp.status_code}: pass --model NAME")
        try:
            return str(resp.json()["data"][0]["id"])
        except (ValueError, KeyError, IndexError, TypeError) as e:
            raise ServerError(
                f"GET {url} listed no model ({resp.text[:200]!r}): pass --model"
            ) from e

    def _body(self, req: GenRequest, *, use_extras: bool) -> dict[str, Any]:
        body: dict[str, Any] = {
            "model": self.model,
            "max_tokens": req.max_tokens,
            "temperature": req.temperature,
            "stream": True,
        }
        if self.target.endpoint == "chat":
            body["messages"] = req.messages or [{"role": "user", "content": req.prompt or ""}]
        else:
            body["prompt"] = req.prompt if req.prompt is not None else _flatten(req.messages)
        if req.seed is not None:
            body["seed"] = req.seed
        if use_extras:
            body["stream_options"] = {"include_usage": True}
            if req.is_fixed_len:
                body.update(min_tokens=req.max_tokens, ignore_eos=True)
        return body

    async def generate(self, req: GenRequest) -> RequestResult:
        """Stream one request; failures are recorded in the result, never raised."""
        use_extras = self.is_fixed_len_accepted is not False
        result = await self._stream(self._body(req, use_extras=use_extras))
        if use_extras and result.error and result.error.startswith(("HTTP 400", "HTTP 422")):
            # The server refuses the extra fields: retry once without them and stop sending them.
            retry = await self._stream(self._body(req, use_extras=False))
            if retry.is_ok:
                self.is_fixed_len_accepted = False
            return retry
        if use_extras and result.is_ok and self.is_fixed_len_accepted is None:
            self.is_fixed_len_accepted = True
        return result

    async def count_prompt_tokens(self, prompt: str) -> int | None:
        """The server's token count of `prompt` as sent (None when it reports no usage)."""
        res = await self.generate(GenRequest(prompt=prompt, max_tokens=1, is_fixed_len=False))
        if res.error:
            raise ServerError(f"a 1-token probe request failed: {res.error}")
        return res.prompt_tokens

    async def _stream(self, body: dict[str, Any]) -> RequestResult:
        res = RequestResult(start_s=time.perf_counter())
        path = _PATHS[self.target.endpoint]
        try:
            async with self._http.stream("POST", path, json=body) as resp:
                if resp.status_code != 200:
                    text = (await resp.aread()).decode(errors="replace")
                    res.error = f"HTTP {resp.status_code}: {text[:300]}"
                else:
                    await self._read_events(resp, res)
        except httpx.HTTPError as e:
            res.error = f"{type(e).__name__}: {e}"
        res.e2e_s = time.perf_counter() - res.start_s
        if res.error is None and res.output_tokens == 0:
            res.output_tokens = len(res.chunk_times_s)
        return res

    async def _read_events(self, resp: httpx.Response, res: RequestResult) -> None:
        event = "message"
        async for line in resp.aiter_lines():
            if line.startswith("event:"):
                event = line[6:].strip()
                continue
            if not line.startswith("data:"):
                continue
            payload = line[5:].strip()
            if payload == "[DONE]":
                return
            try:
                obj = json.loads(payload)
            except json.JSONDecodeError:
                res.error = f"unparseable stream chunk {payload[:200]!r}"
                return
            if event == "error" or "error" in obj:
                res.error = f"stream error: {json.dumps(obj.get('error', obj))[:300]}"
                return
            _absorb(obj, res, time.perf_counter() - res.start_s)


def _absorb(obj: dict[str, Any], res: RequestResult, now_s: float) -> None:
    """Fold one stream chunk into `res`: text, chunk time, finish reason, usage."""
    for choice in obj.get("choices") or []:
        delta = choice.get("delta") or {}
        piece = choice.get("text") or delta.get("content") or delta.get("reasoning_content")
        piece = piece or delta.get("reasoning") or ""
        if piece:
            if res.ttft_s is None:
                res.ttft_s = now_s
            res.chunk_times_s.append(now_s)
            res.text += piece
        if choice.get("finish_reason"):
            res.finish_reason = choice["finish_reason"]
    usage = obj.get("usage")
    if usage:
        res.prompt_tokens = usage.get("prompt_tokens", res.prompt_tokens)
        res.output_tokens = usage.get("completion_tokens") or res.output_tokens
        details = usage.get("prompt_tokens_details") or {}
        res.cached_tokens = details.get("cached_tokens", res.cached_tokens)


def _flatten(messages: list[dict[str, str]] | None) -> str:
    return "\n\n".join(str(m.get("content", "")) for m in messages or [])
