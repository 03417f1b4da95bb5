"""Stored responses for `previous_response_id`, `GET` and `DELETE /v1/responses/{id}` (SQLite).

One row per stored response: the response object and the conversation's items up to and
including its output, so a follow-up needs one row. A file under the data folder when one is
set (kept across restarts), else an in-memory database. At most `max_responses` rows are kept;
the oldest go first. Calls block briefly: the routes run them in a worker thread.
"""

from __future__ import annotations

import json
import sqlite3
import threading
from pathlib import Path
from typing import Any, cast

DB_FILE = "responses.sqlite3"
_SCHEMA = """
CREATE TABLE IF NOT EXISTS responses (
    seq INTEGER PRIMARY KEY AUTOINCREMENT,
    id TEXT UNIQUE NOT NULL,
    response TEXT NOT NULL,
    items TEXT NOT NULL,
    num_output INTEGER NOT NULL
)
"""


class ResponseStore:
    """Owns the stored responses; safe to call from several threads."""

    def __init__(self, data_dir: Path | None, *, max_responses: int) -> None:
        if data_dir is not None:
            data_dir.mkdir(parents=True, exist_ok=True)
        target = ":memory:" if data_dir is None else str(data_dir / DB_FILE)
        self._db = sqlite3.connect(target, check_same_thread=False)
        self._lock = threading.Lock()
        self._max = max_responses
        with self._lock, self._db:
            self._db.execute(_SCHEMA)

    def put(self, response: dict[str, Any], items: list[dict[str, Any]], num_output: int) -> None:
        """Store `response` and its conversation `items` (the last `num_output` are its output)."""
        if self._max == 0:
            return
        row = (response["id"], json.dumps(response), json.dumps(items), num_output)
        with self._lock, self._db:
            self._db.execute(
                "INSERT OR REPLACE INTO responses (id, response, items, num_output) "
                "VALUES (?, ?, ?, ?)",
                row,
            )
            self._db.execute(
                "DELETE FROM responses WHERE seq NOT IN "
                "(SELECT seq FROM responses ORDER BY seq DESC LIMIT ?)",
                (self._max,),
            )

    def get(self, response_id: str) -> dict[str, Any] | None:
        row = self._row("SELECT response FROM responses WHERE id = ?", response_id)
        return None if row is None else cast("dict[str, Any]", json.loads(row[0]))

    def items(self, response_id: str) -> list[dict[str, Any]] | None:
        """The conversation up to and including the response's output."""
        row = self._row("SELECT items FROM responses WHERE id = ?", response_id)
        return None if row is None else cast("list[dict[str, Any]]", json.loads(row[0]))

    def input_items(self, response_id: str) -> list[dict[str, Any]] | None:
        """The items the response was generated from (its output left out)."""
        row = self._row("SELECT items, num_output FROM responses WHERE id = ?", response_id)
        if row is None:
            return None
        items = cast("list[dict[str, Any]]", json.loads(row[0]))
        return items[: len(items) - int(row[1])]

    def delete(self, response_id: str) -> bool:
        with self._lock, self._db:
            cur = self._db.execute("DELETE FROM responses WHERE id = ?", (response_id,))
        return cur.rowcount > 0

    def close(self) -> None:
        with self._lock:
            self._db.close()

    def _row(self, query: str, response_id: str) -> tuple[Any, ...] | None:
        with self._lock:
            return self._db.execute(query, (response_id,)).fetchone()
