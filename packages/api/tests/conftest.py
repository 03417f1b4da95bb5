"""A real `sparkinfer-api` server on the embedded default model, on a free port."""

from __future__ import annotations

import contextlib
import itertools
import socket
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, TypeVar

import httpx
import pytest
import uvicorn
from fastapi import FastAPI
from sparkinfer.api.main import create_app
from sparkinfer.api.settings import load_settings, server_config
from sparkinfer.model.embedded import RANDOM_MODEL_ID

T = TypeVar("T")


@dataclass(frozen=True)
class RunningServer:
    base_url: str
    app: FastAPI

    @property
    def v1(self) -> str:
        return self.base_url + "/v1"


@contextlib.contextmanager
def serve(**overrides: Any) -> Iterator[RunningServer]:
    """Start the server (embedded model, random weights) in a thread; stop it on exit."""
    settings = load_settings({"max_model_len": 1024, "keep_alive_s": 0.2, **overrides}, environ={})
    app = create_app(server_config(settings))
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    server = uvicorn.Server(
        uvicorn.Config(app, log_level="warning", lifespan="on", timeout_graceful_shutdown=1)
    )
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    deadline = time.monotonic() + 120
    while not server.started:
        if not thread.is_alive() or time.monotonic() > deadline:
            raise RuntimeError("the test server did not start")
        time.sleep(0.05)
    try:
        yield RunningServer(f"http://127.0.0.1:{port}", app)
    finally:
        server.should_exit = True
        thread.join(30)
        sock.close()


@pytest.fixture(scope="session")
def server() -> Iterator[RunningServer]:
    with serve(max_num_seqs=8) as running:
        yield running


@pytest.fixture(scope="session")
def random_server() -> Iterator[RunningServer]:
    """The built-in random-weights model: its reasoning never closes by itself, so a reasoning
    budget always yields both reasoning and an answer (the trained default may skip thinking)."""
    with serve(model=RANDOM_MODEL_ID, max_num_seqs=2) as running:
        yield running


def stream_gap_during(base_url: str, hostile: Callable[[], T]) -> tuple[float, T]:
    """The longest pause of another client's token stream while `hostile()` runs, and what it
    returned: a request that holds the event loop or Python's global lock shows up here."""
    times: list[float] = []
    is_first = threading.Event()
    is_done = threading.Event()

    def read() -> None:
        body = {"prompt": "def", "max_tokens": 900, "ignore_eos": True, "stream": True}
        with httpx.stream("POST", base_url + "/v1/completions", json=body, timeout=60) as resp:
            for _ in resp.iter_raw():
                times.append(time.perf_counter())
                is_first.set()
                if is_done.is_set():
                    break

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    assert is_first.wait(60), "the measuring stream did not start"
    start = time.perf_counter()
    result = hostile()
    end = time.perf_counter()
    is_done.set()
    reader.join(60)
    inside = [start, *(t for t in times if start < t < end), end]
    assert any(t >= end for t in times), "the measuring stream ended before the request did"
    return max(b - a for a, b in itertools.pairwise(inside)), result
