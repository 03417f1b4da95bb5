"""Rank 0's watch over the other ranks' processes: the first to exit unasked is reported."""

from __future__ import annotations

import multiprocessing.connection
import threading
from collections.abc import Callable
from multiprocessing.process import BaseProcess

_JOIN_S = 10.0  # how long a stopping rank may take before it is terminated


class RankWatchdog:
    """Waits on the other ranks' processes; the first to exit before `stop` is reported."""

    def __init__(self, procs: list[BaseProcess], on_exit: Callable[[str], None]) -> None:
        self.procs = procs
        self._on_exit = on_exit
        self._is_stopping = threading.Event()
        self._thread = threading.Thread(target=self._watch, name="sparkinfer-tp-watch", daemon=True)
        self._thread.start()

    def _watch(self) -> None:
        sentinels = {p.sentinel: rank for rank, p in enumerate(self.procs, start=1)}
        ready = multiprocessing.connection.wait(list(sentinels))
        if self._is_stopping.is_set():
            return
        rank = sentinels[ready[0]]  # pyright: ignore[reportArgumentType]
        code = self.procs[rank - 1].exitcode
        self._on_exit(
            f"tensor-parallel rank {rank} (pid {self.procs[rank - 1].pid}) exited with code "
            f"{code}: the model is incomplete without it, so the server stops; check that "
            "rank's log above, then restart the server"
        )

    def stop(self, *, is_told: bool) -> None:
        """Wait for the ranks to leave (`is_told`: they were told to stop), terminating any that
        hang or were never told."""
        self._is_stopping.set()
        for p in self.procs:
            p.join(_JOIN_S if is_told else 0)
            if p.is_alive():
                p.terminate()
                p.join(_JOIN_S)
