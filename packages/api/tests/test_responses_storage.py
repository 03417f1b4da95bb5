"""Stored responses through HTTP: server-made ids, one owner per response (named API keys),
OpenAI's metadata and user limits, byte budgets, only what the model sees stored, chains kept as
links, a failed write that still answers, and a file that survives kill -9."""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from sparkinfer.api.response_store import DB_FILE

from .conftest import RunningServer, serve

KEYS = {"alice": "sk-alice", "bob": "sk-bob"}
ALICE = {"Authorization": "Bearer sk-alice"}
BOB = {"x-api-key": "sk-bob"}
BASE = {"max_output_tokens": 2, "reasoning": {"effort": "none"}}


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("store") / "data"


@pytest.fixture(scope="module")
def keyed(tmp_path_factory: pytest.TempPathFactory, data_dir: Path) -> Iterator[RunningServer]:
    keys_file = tmp_path_factory.mktemp("keys") / "keys.json"
    keys_file.write_text(json.dumps(KEYS))
    with serve(
        api_keys_file=str(keys_file),
        data_dir=str(data_dir),
        max_stored_response_bytes=20_000,
        max_stored_bytes=60_000,
    ) as running:
        yield running


def _create(server: RunningServer, headers: dict[str, str], **body: Any) -> httpx.Response:
    sent = {**BASE, "input": "Hi", **body}
    return httpx.post(server.v1 + "/responses", json=sent, headers=headers, timeout=60)


def test_ids_are_made_by_the_server(keyed: RunningServer) -> None:
    same = {**ALICE, "X-Request-Id": "chosen"}
    first, second = _create(keyed, same).json(), _create(keyed, same).json()
    assert first["id"] != second["id"] and "chosen" not in first["id"] + second["id"]
    for rid in (first["id"], second["id"]):  # neither replaced the other
        assert httpx.get(f"{keyed.v1}/responses/{rid}", headers=ALICE).status_code == 200


def test_only_the_owner_reads_continues_or_deletes(keyed: RunningServer) -> None:
    rid = _create(keyed, ALICE).json()["id"]
    url = f"{keyed.v1}/responses/{rid}"
    assert httpx.get(url, headers=BOB).status_code == 404
    assert httpx.get(url + "/input_items", headers=BOB).status_code == 404
    assert _create(keyed, BOB, previous_response_id=rid).status_code == 404
    assert httpx.delete(url, headers=BOB).status_code == 404
    assert httpx.get(url, headers=ALICE).json()["id"] == rid
    assert _create(keyed, ALICE, previous_response_id=rid).status_code == 200
    assert httpx.delete(url, headers=ALICE).status_code == 200


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("metadata", {f"k{i}": "v" for i in range(17)}),
        ("metadata", {"k" * 65: "v"}),
        ("metadata", {"k": "v" * 513}),
        ("user", "u" * 65),
    ],
)
def test_metadata_and_user_keep_openais_limits(
    keyed: RunningServer, field: str, value: Any
) -> None:
    r = _create(keyed, ALICE, **{field: value})
    assert r.status_code == 400 and r.json()["error"]["param"].startswith(field), r.text


def test_a_1mb_previous_response_id_is_refused_briefly(keyed: RunningServer) -> None:
    r = _create(keyed, ALICE, previous_response_id="r" * 1_000_000)
    assert r.status_code == 400 and len(r.content) < 1000
    assert r.json()["error"]["param"] == "previous_response_id"


def test_input_over_the_budget_is_refused_before_it_runs(keyed: RunningServer) -> None:
    r = _create(keyed, ALICE, input="word " * 5000)  # 25 KB to store; 20 KB allowed
    assert r.status_code == 400 and r.json()["error"]["param"] == "input"
    assert "store false" in r.json()["error"]["message"]


def test_only_what_the_model_sees_is_stored_and_chains_are_links(
    keyed: RunningServer, data_dir: Path
) -> None:
    noise = [{"type": "reasoning", "summary": [], "content": []}] * 500
    first_input = [
        {"type": "message", "role": "user", "content": "first turn", "junk": "j" * 5000},
        *noise,
    ]
    first = _create(keyed, ALICE, input=first_input).json()
    rid = first["id"]
    for turn in ("second turn", "third turn"):
        rid = _create(keyed, ALICE, input=turn, previous_response_id=rid).json()["id"]
    items = httpx.get(f"{keyed.v1}/responses/{rid}/input_items", headers=ALICE).json()["data"]
    users = [i["content"] for i in items if i.get("role") == "user"]
    assert users == ["first turn", "second turn", "third turn"]
    assert not any("junk" in i or (i["type"] == "reasoning" and not i["content"]) for i in items)
    with sqlite3.connect(data_dir / DB_FILE) as db:
        rows = [r[0] for r in db.execute("SELECT items FROM responses")]
    assert sum("first turn" in r for r in rows) == 1  # each item once, however long the chain


def test_the_total_budget_drops_the_oldest(keyed: RunningServer) -> None:
    metadata = {f"k{i}": "v" * 512 for i in range(16)}  # ~8.5 KB a response
    ids = [_create(keyed, ALICE, metadata=metadata).json()["id"] for _ in range(8)]
    found = [httpx.get(f"{keyed.v1}/responses/{i}", headers=ALICE).status_code for i in ids]
    assert found[0] == 404 and found[-1] == 200


def test_a_failed_write_still_answers(keyed: RunningServer) -> None:
    db: sqlite3.Connection = keyed.app.state.responses._db
    (pages,) = db.execute("PRAGMA page_count").fetchone()
    db.execute(f"PRAGMA max_page_count = {pages}")  # the disk is full from here
    try:
        big = {f"k{i}": "v" * 512 for i in range(16)}
        whole = _create(keyed, ALICE, metadata=big, input="x " * 300)
        assert whole.status_code == 200, whole.text
        body = whole.json()
        assert body["store"] is False and body["error"]["code"] == "server_error"
        assert body["status"] in ("completed", "incomplete") and body["usage"]["output_tokens"]
        lines = httpx.post(
            keyed.v1 + "/responses",
            json={**BASE, "input": "x " * 300, "metadata": big, "stream": True},
            headers=ALICE,
            timeout=60,
        ).text.splitlines()
        events = [json.loads(x[6:]) for x in lines if x.startswith("data: ")]
        last = events[-1]
        assert last["type"] in ("response.completed", "response.incomplete"), last
        assert last["response"]["store"] is False and last["response"]["error"]
    finally:
        db.execute("PRAGMA max_page_count = 1073741823")


def _start(port: int, data_dir: Path) -> subprocess.Popen[bytes]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("SPARKINFER_")}
    command = [sys.executable, "-c", "from sparkinfer.api.main import main; main()"]
    flags = ["--port", str(port), "--data-dir", str(data_dir), "--max-model-len", "256"]
    return subprocess.Popen([*command, *flags, "--log-level", "warning"], env=env)


def _wait(base: str, proc: subprocess.Popen[bytes]) -> None:
    deadline = time.monotonic() + 120
    while True:
        assert proc.poll() is None and time.monotonic() < deadline, "the server did not start"
        try:
            if httpx.get(base + "/health", timeout=2).status_code == 200:
                return
        except httpx.TransportError:
            time.sleep(0.2)


def test_stored_responses_survive_kill_9(tmp_path: Path) -> None:
    from .test_serve import _free_port  # pyright: ignore[reportPrivateUsage]

    port = _free_port()
    base = f"http://127.0.0.1:{port}"
    proc = _start(port, tmp_path)
    try:
        _wait(base, proc)
        body = {**BASE, "input": "remember me"}
        rid = httpx.post(base + "/v1/responses", json=body, timeout=60).json()["id"]
        os.kill(proc.pid, signal.SIGKILL)
    finally:
        proc.kill()
        proc.wait(30)
    with serve(data_dir=str(tmp_path)) as restarted:  # the same folder, a new server
        url = f"{restarted.v1}/responses/{rid}/input_items"
        items = httpx.get(url, timeout=10).json()["data"]
    assert items[0]["content"] == "remember me"
