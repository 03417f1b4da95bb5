"""The app under uvicorn as `sparkinfer-api` runs it: the header deadline, and SIGTERM under load
draining within its limit, ending the rest with an error event and exiting 0."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator

import httpx
import pytest
from sparkinfer.api.main import create_app
from sparkinfer.api.serve import build_server
from sparkinfer.api.settings import load_settings, server_config


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.fixture(scope="module")
def base_url() -> Iterator[str]:
    port = _free_port()
    settings = load_settings(
        {"max_model_len": 256, "port": port, "header_read_timeout_s": 0.5, "log_level": "warning"},
        environ={},
    )
    config = server_config(settings)
    server = build_server(create_app(config), config.listen)
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 120
    while not server.started:
        assert thread.is_alive() and time.monotonic() < deadline, "the server did not start"
        time.sleep(0.05)
    yield f"http://127.0.0.1:{port}"
    server.should_exit = True
    thread.join(30)


def test_slow_headers_are_cut_off(base_url: str) -> None:
    host, port = base_url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=10) as sock:
        sock.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\n")  # never finished
        start = time.monotonic()
        assert sock.recv(1024) == b""  # closed by the server
        assert time.monotonic() - start < 5
    assert httpx.get(base_url + "/health", timeout=10).status_code == 200


def test_sigterm_drains_for_its_limit_then_exits_0() -> None:
    port = _free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("SPARKINFER_")}
    env |= {"SPARKINFER_SHUTDOWN_DRAIN_S": "1", "SPARKINFER_MAX_MODEL_LEN": "4096"}
    command = [sys.executable, "-c", "from sparkinfer.api.main import main; main()"]
    proc = subprocess.Popen(
        [*command, "--port", str(port), "--log-level", "warning"],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 120
        while True:
            assert proc.poll() is None, proc.stderr.read() if proc.stderr else ""
            assert time.monotonic() < deadline, "the server did not start"
            try:
                if httpx.get(base + "/health", timeout=2).status_code == 200:
                    break
            except httpx.TransportError:
                time.sleep(0.2)
        body = {"prompt": "def", "stream": True, "ignore_eos": True, "max_tokens": 4000}  # long
        with httpx.stream("POST", base + "/v1/completions", json=body, timeout=60) as resp:
            lines = resp.iter_lines()
            next(lines)
            start = time.monotonic()
            proc.send_signal(signal.SIGTERM)
            rest = list(lines)
        assert "event: error" in rest and "data: [DONE]" in rest
        assert any("shutting down" in line for line in rest)
        assert proc.wait(timeout=30) == 0
        assert time.monotonic() - start < 1 + 10
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
