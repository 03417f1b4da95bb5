"""Data parallel as docs/scaling.md runs it: two embedded-default replicas behind sglang-router's
cache-aware policy on loopback, driven with the openai client through the router.

Each conversation's turns must reach one replica (the one holding its prefix, where they hit its
prefix cache). Skipped where the router is not installed (it is a Linux test dependency).
"""

from __future__ import annotations

import os
import re
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from openai import OpenAI
from openai.types.chat import ChatCompletionMessageParam

ROUTER = shutil.which("sglang-router") or str(Path(sys.executable).with_name("sglang-router"))
START_S = 180
SYSTEM = {
    "a": "You write small Python helpers for parsing log files. " * 24,
    "b": "You review SQL migrations for a billing service, one table at a time. " * 20,
}
pytestmark = pytest.mark.skipif(not Path(ROUTER).is_file(), reason="sglang-router not installed")


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _wait_healthy(url: str, proc: subprocess.Popen[bytes]) -> None:
    deadline = time.monotonic() + START_S
    while True:
        assert proc.poll() is None, f"{proc.args} exited with {proc.returncode}"
        assert time.monotonic() < deadline, f"{url} did not become healthy"
        try:
            if httpx.get(url + "/health", timeout=2).status_code == 200:
                return
        except httpx.TransportError:
            pass
        time.sleep(0.3)


@pytest.fixture(scope="module")
def cluster() -> Iterator[tuple[str, list[str]]]:
    """(router url, replica urls)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("SPARKINFER_")}
    env |= {"SPARKINFER_MAX_MODEL_LEN": "2048", "SPARKINFER_PREFIX_CACHE_MIN_TOKENS": "128"}
    serve = [sys.executable, "-c", "from sparkinfer.api.main import main; main()"]
    ports = [_free_port() for _ in range(3)]
    replicas = [f"http://127.0.0.1:{p}" for p in ports[1:]]
    procs: list[subprocess.Popen[bytes]] = []
    try:
        for port in ports[1:]:
            command = [*serve, "--port", str(port), "--log-level", "warning"]
            procs.append(subprocess.Popen(command, env=env, stdout=subprocess.DEVNULL))
        for url, proc in zip(replicas, procs, strict=True):
            _wait_healthy(url, proc)
        router = [ROUTER, "launch", "--host", "127.0.0.1", "--port", str(ports[0])]
        router += ["--policy", "cache_aware", "--worker-urls", *replicas]
        procs.append(subprocess.Popen(router, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
        _wait_healthy(f"http://127.0.0.1:{ports[0]}", procs[-1])
        yield f"http://127.0.0.1:{ports[0]}", replicas
    finally:
        for proc in procs:
            proc.terminate()
        for proc in procs:
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                proc.kill()


def _served(replica: str) -> tuple[int, int]:
    """(requests finished, prompt tokens served from its prefix cache) of one replica."""
    text = httpx.get(replica + "/metrics", timeout=10).text

    def metric(name: str) -> int:
        found = re.search(rf"^{name} ([0-9.e+]+)$", text, re.MULTILINE)
        return int(float(found[1])) if found else 0

    return (
        metric("sparkinfer_e2e_request_latency_seconds_count"),
        metric("sparkinfer_prompt_cached_tokens_total"),
    )


def test_each_conversation_stays_on_the_replica_holding_its_prefix(
    cluster: tuple[str, list[str]],
) -> None:
    router, replicas = cluster
    client = OpenAI(base_url=router + "/v1", api_key="unused", max_retries=0, timeout=120)
    model = httpx.get(replicas[0] + "/v1/models", timeout=10).json()["data"][0]["id"]
    for key, system in SYSTEM.items():
        before = [_served(r) for r in replicas]
        messages: list[ChatCompletionMessageParam] = [{"role": "system", "content": system}]
        for turn in range(3):
            messages.append({"role": "user", "content": f"turn {turn} of conversation {key}"})
            reply = client.chat.completions.create(
                model=model,
                messages=messages,
                max_tokens=8,
                temperature=0,
            )
            content = reply.choices[0].message.content or ""
            messages.append({"role": "assistant", "content": content})
        after = [_served(r) for r in replicas]
        counts = [a[0] - b[0] for a, b in zip(after, before, strict=True)]
        assert sorted(counts) == [0, 3], f"conversation {key} was split: {counts}"
        home = counts.index(3)
        assert after[home][1] > before[home][1], "its later turns missed the prefix cache"


def test_a_stream_passes_through_the_router(cluster: tuple[str, list[str]]) -> None:
    router, replicas = cluster
    client = OpenAI(base_url=router + "/v1", api_key="unused", max_retries=0, timeout=120)
    model = httpx.get(replicas[0] + "/v1/models", timeout=10).json()["data"][0]["id"]
    stream = client.completions.create(
        model=model, prompt="def add(a, b):", max_tokens=6, stream=True
    )
    text = "".join(chunk.choices[0].text for chunk in stream if chunk.choices)
    assert text
