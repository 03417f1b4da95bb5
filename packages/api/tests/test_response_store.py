"""ResponseStore: owners, links, budgets with eviction, deletes that keep later links, a private
WAL file that outlives the store, and a failed write that changes nothing."""

from __future__ import annotations

import sqlite3
import stat
from pathlib import Path
from typing import Any

import pytest
from sparkinfer.api.response_store import (
    BrokenConversation,
    ResponseStore,
    StoredResponseTooLarge,
    StoreLimits,
)

LIMITS = StoreLimits(max_responses=10, max_response_bytes=10_000, max_total_bytes=100_000)


def _put(store: ResponseStore, rid: str, previous: str | None = None, owner: str = "a") -> None:
    items = [{"type": "message", "role": "user", "content": rid}, {"type": "message", "id": "o"}]
    store.put(owner, {"id": rid, "previous_response_id": previous}, items, 1)


def test_put_get_items_delete() -> None:
    store = ResponseStore(None, limits=LIMITS)
    _put(store, "resp_a")
    assert store.get("a", "resp_a") == {"id": "resp_a", "previous_response_id": None}
    assert [i["content"] for i in store.input_items("a", "resp_a") or []] == ["resp_a"]
    assert len(store.items("a", "resp_a") or []) == 2
    assert store.delete("a", "resp_a") and not store.delete("a", "resp_a")
    assert store.get("a", "resp_a") is None and store.items("a", "resp_a") is None


def test_only_the_owner_reads_or_deletes() -> None:
    store = ResponseStore(None, limits=LIMITS)
    _put(store, "resp_a", owner="alice")
    assert store.get("bob", "resp_a") is None and store.items("bob", "resp_a") is None
    assert not store.delete("bob", "resp_a")
    assert store.get("alice", "resp_a") is not None


def test_an_id_is_stored_once() -> None:
    store = ResponseStore(None, limits=LIMITS)
    _put(store, "resp_a", owner="alice")
    with pytest.raises(sqlite3.IntegrityError):
        _put(store, "resp_a", owner="bob")
    assert store.get("alice", "resp_a") is not None


def test_a_chain_stores_links_and_reads_whole() -> None:
    store = ResponseStore(None, limits=LIMITS)
    _put(store, "resp_1")
    _put(store, "resp_2", "resp_1")
    _put(store, "resp_3", "resp_2")
    items = store.items("a", "resp_3") or []
    assert [i.get("content") for i in items[::2]] == ["resp_1", "resp_2", "resp_3"]
    assert [i["content"] for i in store.input_items("a", "resp_3") or [] if "content" in i] == [
        "resp_1", "resp_2", "resp_3"
    ]  # fmt: skip
    # A deleted response that a later one links to stays for the chain, hidden.
    assert store.delete("a", "resp_2") and store.get("a", "resp_2") is None
    assert len(store.items("a", "resp_3") or []) == 6
    assert store.delete("a", "resp_3")  # now nothing links to resp_2: both rows go
    rows = store._db.execute("SELECT id FROM responses").fetchall()  # pyright: ignore[reportPrivateUsage]
    assert rows == [("resp_1",)]


def test_retention_drops_the_oldest_by_count_and_bytes() -> None:
    store = ResponseStore(None, limits=StoreLimits(2, 10_000, 100_000))
    for rid in ("resp_1", "resp_2", "resp_3"):
        _put(store, rid)
    assert store.get("a", "resp_1") is None
    assert store.get("a", "resp_2") is not None and store.get("a", "resp_3") is not None
    store = ResponseStore(None, limits=StoreLimits(100, 1_000, 2_500))
    big = [{"type": "message", "role": "user", "content": "x" * 800}]
    for rid in ("resp_1", "resp_2", "resp_3", "resp_4"):
        store.put("a", {"id": rid}, big, 0)
    assert [store.get("a", f"resp_{i}") is not None for i in (1, 2, 3, 4)] == [
        False, False, True, True
    ]  # fmt: skip
    with pytest.raises(StoredResponseTooLarge):
        store.put("a", {"id": "resp_5"}, [{"content": "x" * 2000}], 0)


def test_a_dropped_link_breaks_the_chain_loudly() -> None:
    store = ResponseStore(None, limits=StoreLimits(2, 10_000, 100_000))
    _put(store, "resp_1")
    _put(store, "resp_2", "resp_1")
    _put(store, "resp_3", "resp_2")  # resp_1 dropped
    with pytest.raises(BrokenConversation) as info:
        store.items("a", "resp_3")
    assert info.value.missing_id == "resp_1"


def test_zero_retention_stores_nothing() -> None:
    store = ResponseStore(None, limits=StoreLimits(0, 10_000, 100_000))
    _put(store, "resp_1")
    assert store.get("a", "resp_1") is None


def test_data_dir_is_private_wal_and_kept_across_stores(tmp_path: Path) -> None:
    first = ResponseStore(tmp_path / "data", limits=LIMITS)
    _put(first, "resp_kept")
    first.close()
    assert stat.S_IMODE((tmp_path / "data").stat().st_mode) == 0o700
    for path in (tmp_path / "data").iterdir():
        assert stat.S_IMODE(path.stat().st_mode) == 0o600, path
    second = ResponseStore(tmp_path / "data", limits=LIMITS)
    assert second.get("a", "resp_kept") is not None
    mode: Any = second._db.execute("PRAGMA journal_mode").fetchone()  # pyright: ignore[reportPrivateUsage]
    assert mode == ("wal",)


def test_a_failed_write_changes_nothing(tmp_path: Path) -> None:
    store = ResponseStore(tmp_path, limits=LIMITS)
    _put(store, "resp_1")
    db = store._db  # pyright: ignore[reportPrivateUsage]
    (pages,) = db.execute("PRAGMA page_count").fetchone()
    db.execute(f"PRAGMA max_page_count = {pages}")  # the database is full
    with pytest.raises(sqlite3.Error):
        store.put("a", {"id": "resp_2"}, [{"content": "x" * 9000}], 0)
    assert store.get("a", "resp_2") is None and store.get("a", "resp_1") is not None
