"""`sparkinfer-api --tensor-parallel-size 2` on the CPU (gloo): it serves, and a rank that dies
takes the server down with an error naming it (exit status 1), never a hang."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest
import torch
from sparkinfer.api.settings import SettingsError, load_settings, server_config
from sparkinfer.api.tensor_parallel import check_config

START_S = 180


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _spawned_ranks(parent: int) -> list[int]:
    """Pids of the ranks `parent` spawned (not multiprocessing's resource tracker)."""
    pids = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
            cmdline = (stat.parent / "cmdline").read_bytes()
        except OSError:
            continue
        if int(fields[1]) == parent and b"spawn_main" in cmdline:
            pids.append(int(stat.parent.name))
    return pids


@pytest.mark.skipif(not Path("/proc").is_dir(), reason="finds the ranks through /proc")
def test_two_ranks_serve_and_a_dead_rank_stops_the_server() -> None:
    port = _free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("SPARKINFER_")}
    command = [sys.executable, "-c", "from sparkinfer.api.main import main; main()"]
    command += ["--port", str(port), "--device", "cpu", "--tensor-parallel-size", "2"]
    command += ["--max-model-len", "512", "--log-level", "warning"]
    proc = subprocess.Popen(command, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + START_S
        while True:
            assert proc.poll() is None, proc.stderr.read() if proc.stderr else ""
            assert time.monotonic() < deadline, "the server did not start"
            try:
                if httpx.get(base + "/health", timeout=2).status_code == 200:
                    break
            except httpx.TransportError:
                time.sleep(0.3)
        body = {"prompt": "def add(a, b):", "max_tokens": 8, "temperature": 0}
        reply = httpx.post(base + "/v1/completions", json=body, timeout=60)
        assert reply.status_code == 200 and reply.json()["choices"][0]["text"]
        (rank1,) = _spawned_ranks(proc.pid)
        os.kill(rank1, signal.SIGKILL)
        assert proc.wait(timeout=60) == 1
        assert proc.stderr is not None
        log = proc.stderr.read().decode()
        assert "tensor-parallel rank 1" in log and "restart the server" in log
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_what_tensor_parallel_cannot_serve_stops_start_up() -> None:
    settings = load_settings({"tensor_parallel_size": 2, "speculative": "ngram"}, environ={})
    with pytest.raises(SettingsError, match="--speculative"):
        check_config(server_config(settings), torch.device("cpu"))
    auto = load_settings({"tensor_parallel_size": 2}, environ={})  # speculative auto: plain there
    check_config(server_config(auto), torch.device("cpu"))
