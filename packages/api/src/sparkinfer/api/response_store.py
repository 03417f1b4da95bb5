"""Stored responses for `previous_response_id`, `GET` and `DELETE /v1/responses/{id}` (SQLite).

One row per stored response: its id (made by the server), its owner (the name of the API key
that made it), the response object, the items this turn added (its input as the model saw it,
then its output) and a link to the previous response of its conversation. A conversation is
read by following the links, so a chain of N responses stores each item once.

Budgets: at most `max_responses` rows and `max_total_bytes` in all (the oldest go first), each
row at most `max_response_bytes` (`StoredResponseTooLarge`). A file under the data folder when
one is set (kept across restarts: WAL journal, folder 0700, files 0600), else an in-memory
database. A failed write raises `sqlite3.Error` and changes nothing. Calls block briefly: the
routes run them in a worker thread.
"""

from __future__ import annotations

import json
import os
import sqlite3
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

DB_FILE = "responses.sqlite3"
_SCHEMA = (
    """CREATE TABLE IF NOT EXISTS responses (
    seq INTEGER PRIMARY KEY AUTOINCREMENT,
    id TEXT UNIQUE NOT NULL,
    owner TEXT NOT NULL,
    previous_id TEXT,
    response TEXT NOT NULL,
    items TEXT NOT NULL,
    num_output INTEGER NOT NULL,
    num_bytes INTEGER NOT NULL,
    is_deleted INTEGER NOT NULL DEFAULT 0
)""",
    "CREATE INDEX IF NOT EXISTS responses_previous ON responses (previous_id)",
)


class StoredResponseTooLarge(ValueError):
    """One response (with the items it adds) is over `max_response_bytes`."""


class BrokenConversation(LookupError):
    """An earlier response of the conversation is no longer stored (`missing_id`)."""

    def __init__(self, missing_id: str) -> None:
        super().__init__(missing_id)
        self.missing_id = missing_id


@dataclass(frozen=True)
class StoreLimits:
    max_responses: int
    max_response_bytes: int
    max_total_bytes: int


def _private_file(path: Path) -> None:
    """The folder 0700 and the database file 0600 (SQLite gives its journal the file's mode)."""
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    os.chmod(path.parent, 0o700)
    os.close(os.open(path, os.O_CREAT | os.O_RDWR, 0o600))
    os.chmod(path, 0o600)


class ResponseStore:
    """Owns the stored responses; safe to call from several threads."""

    def __init__(self, data_dir: Path | None, *, limits: StoreLimits) -> None:
        target = ":memory:"
        if data_dir is not None:
            _private_file(data_dir / DB_FILE)
            target = str(data_dir / DB_FILE)
        self._db = sqlite3.connect(target, check_same_thread=False, isolation_level=None)
        self._lock = threading.Lock()
        self.limits = limits
        with self._lock:
            self._db.execute("PRAGMA auto_vacuum = INCREMENTAL")  # before the first table
            self._db.execute("PRAGMA journal_mode = WAL")
            self._db.execute("PRAGMA synchronous = NORMAL")  # durable across a killed process
            for statement in _SCHEMA:
                self._db.execute(statement)

    def put(
        self,
        owner: str,
        response: dict[str, Any],
        items: list[dict[str, Any]],
        num_output: int,
    ) -> None:
        """Store `response` with the `items` it adds to its conversation (the last `num_output`
        are its output), linked to its `previous_response_id`; the oldest rows make room."""
        if self.limits.max_responses == 0:
            return
        row_response, row_items = json.dumps(response), json.dumps(items)
        num_bytes = len(row_response.encode()) + len(row_items.encode())
        if num_bytes > self.limits.max_response_bytes:
            raise StoredResponseTooLarge(
                f"the response and its input take {num_bytes} bytes; max_stored_response_bytes "
                f"is {self.limits.max_response_bytes}"
            )
        row = (response["id"], owner, response.get("previous_response_id"))
        with self._lock:
            self._db.execute("BEGIN IMMEDIATE")
            try:
                self._db.execute(
                    "INSERT INTO responses (id, owner, previous_id, response, items, num_output, "
                    "num_bytes) VALUES (?, ?, ?, ?, ?, ?, ?)",
                    (*row, row_response, row_items, num_output, num_bytes),
                )
                self._evict()
                self._db.execute("COMMIT")
            except BaseException:
                if self._db.in_transaction:  # SQLite ends some failed ones itself
                    self._db.execute("ROLLBACK")
                raise
            self._db.execute("PRAGMA incremental_vacuum")

    def _evict(self) -> None:
        """Drop the oldest rows until the count and byte budgets hold."""
        rows = self._db.execute("SELECT seq, num_bytes FROM responses ORDER BY seq DESC").fetchall()
        kept_bytes = 0
        for kept, (seq, num_bytes) in enumerate(rows):
            kept_bytes += num_bytes
            if kept >= self.limits.max_responses or kept_bytes > self.limits.max_total_bytes:
                self._db.execute("DELETE FROM responses WHERE seq <= ?", (seq,))
                break
        self._drop_unlinked_deleted()

    def _drop_unlinked_deleted(self) -> None:
        """Deleted rows go once no later response links to them (repeated up the chain)."""
        while True:
            cur = self._db.execute(
                "DELETE FROM responses WHERE is_deleted = 1 AND id NOT IN "
                "(SELECT previous_id FROM responses WHERE previous_id IS NOT NULL)"
            )
            if cur.rowcount == 0:
                return

    def get(self, owner: str, response_id: str) -> dict[str, Any] | None:
        row = self._row("SELECT response", owner, response_id)
        return None if row is None else cast("dict[str, Any]", json.loads(row[0]))

    def items(self, owner: str, response_id: str) -> list[dict[str, Any]] | None:
        """The conversation up to and including the response's output (None: not stored);
        `BrokenConversation` when an earlier response of it was dropped."""
        if self._row("SELECT id", owner, response_id) is None:
            return None
        return self._chain(response_id)

    def input_items(self, owner: str, response_id: str) -> list[dict[str, Any]] | None:
        """The items the response was generated from (its output left out)."""
        row = self._row("SELECT num_output", owner, response_id)
        if row is None:
            return None
        items = self._chain(response_id)
        return items[: len(items) - int(row[0])]

    def delete(self, owner: str, response_id: str) -> bool:
        """Forget a response; rows later responses still link to stay, hidden, until those go."""
        with self._lock:
            self._db.execute("BEGIN IMMEDIATE")
            try:
                cur = self._db.execute(
                    "UPDATE responses SET is_deleted = 1 "
                    "WHERE id = ? AND owner = ? AND is_deleted = 0",
                    (response_id, owner),
                )
                found = cur.rowcount > 0
                self._drop_unlinked_deleted()
                self._db.execute("COMMIT")
            except BaseException:
                if self._db.in_transaction:  # SQLite ends some failed ones itself
                    self._db.execute("ROLLBACK")
                raise
            self._db.execute("PRAGMA incremental_vacuum")
        return found

    def close(self) -> None:
        with self._lock:
            self._db.close()

    def _row(self, select: str, owner: str, response_id: str) -> tuple[Any, ...] | None:
        query = f"{select} FROM responses WHERE id = ? AND owner = ? AND is_deleted = 0"
        with self._lock:
            return self._db.execute(query, (response_id, owner)).fetchone()

    def _chain(self, response_id: str) -> list[dict[str, Any]]:
        """The items of the response and of every response before it, oldest first."""
        with self._lock:
            rows = self._db.execute(
                "WITH RECURSIVE chain(id, previous_id, items, depth) AS ("
                " SELECT id, previous_id, items, 0 FROM responses WHERE id = ?"
                " UNION ALL SELECT r.id, r.previous_id, r.items, chain.depth + 1"
                " FROM responses r JOIN chain ON r.id = chain.previous_id"
                ") SELECT previous_id, items FROM chain ORDER BY depth DESC",
                (response_id,),
            ).fetchall()
        if rows and rows[0][0] is not None:
            raise BrokenConversation(rows[0][0])
        items: list[dict[str, Any]] = []
        for _, part in rows:
            items += json.loads(part)
        return items
