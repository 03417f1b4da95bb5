"""ResponseStore: put/get/items/delete, the retention limit, and a file that outlives the store."""

from __future__ import annotations

from pathlib import Path

from sparkinfer.api.response_store import DB_FILE, ResponseStore


def _put(store: ResponseStore, rid: str) -> None:
    items = [{"type": "message", "role": "user", "content": rid}, {"type": "message", "id": "o"}]
    store.put({"id": rid, "object": "response"}, items, 1)


def test_put_get_items_delete() -> None:
    store = ResponseStore(None, max_responses=10)
    _put(store, "resp_a")
    assert store.get("resp_a") == {"id": "resp_a", "object": "response"}
    assert [i["content"] for i in store.input_items("resp_a") or []] == ["resp_a"]
    assert len(store.items("resp_a") or []) == 2
    assert store.delete("resp_a") and not store.delete("resp_a")
    assert store.get("resp_a") is None and store.items("resp_a") is None


def test_retention_drops_the_oldest() -> None:
    store = ResponseStore(None, max_responses=2)
    for rid in ("resp_1", "resp_2", "resp_3"):
        _put(store, rid)
    assert store.get("resp_1") is None
    assert store.get("resp_2") is not None and store.get("resp_3") is not None


def test_zero_retention_stores_nothing() -> None:
    store = ResponseStore(None, max_responses=0)
    _put(store, "resp_1")
    assert store.get("resp_1") is None


def test_data_dir_keeps_responses_across_stores(tmp_path: Path) -> None:
    first = ResponseStore(tmp_path / "data", max_responses=5)
    _put(first, "resp_kept")
    first.close()
    assert (tmp_path / "data" / DB_FILE).is_file()
    second = ResponseStore(tmp_path / "data", max_responses=5)
    assert second.get("resp_kept") is not None
