"""Arrival time and size of every output of some requests, as the offline engine reports them."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field


@dataclass
class OutputTracker:
    """Filled from the engine thread through `callback`; `done` is set once `num_left` requests
    have finished. `lock` guards the fields and is notified on every output."""

    num_left: int
    submitted_s: float = field(default_factory=time.perf_counter)
    events: dict[str, list[tuple[float, int]]] = field(default_factory=dict)
    finished: set[str] = field(default_factory=set)
    errors: list[str] = field(default_factory=list)
    done: threading.Event = field(default_factory=threading.Event)
    lock: threading.Condition = field(default_factory=threading.Condition)

    def callback(self, request_id: str):
        def on_output(out) -> None:
            now = time.perf_counter()
            with self.lock:
                if out.new_token_ids:
                    self.events.setdefault(request_id, []).append((now, len(out.new_token_ids)))
                if out.is_finished:
                    self.finished.add(request_id)
                    if out.error:
                        self.errors.append(f"{request_id}: {out.error}")
                    self.num_left -= 1
                    if self.num_left == 0:
                        self.done.set()
                self.lock.notify_all()

        return on_output

    def times(self, request_id: str) -> list[float]:
        """Arrival times of the request's outputs so far."""
        with self.lock:
            return [ts for ts, _ in self.events.get(request_id, ())]

    def wait_for(self, predicate: Callable[[], bool], what: str, timeout: float) -> None:
        """Block until predicate() holds (checked under the lock at every output); raises
        TimeoutError after `timeout` s and RuntimeError once a request has failed."""
        with self.lock:
            if not self.lock.wait_for(lambda: predicate() or self.errors, timeout):
                raise TimeoutError(f"{what} took over {timeout:.0f} s")
            if self.errors:
                raise RuntimeError(f"requests failed while waiting for {what}: {self.errors}")
