"""The app under uvicorn: a deadline for each request's headers, and a bounded drain on SIGTERM.

A connection whose request headers do not arrive within `header_read_timeout_s` (from its
opening, or from its previous response) is closed, so slow-header connections cannot pile up.
On SIGTERM the server stops accepting, lets open requests finish for `shutdown_drain_s`, then
ends the rest with an error (an `event: error` for a stream) and exits 0.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import socket
from collections.abc import Callable, Generator
from typing import Any, cast

import uvicorn
from fastapi import FastAPI
from sparkinfer.api.errors import EngineUnavailable
from sparkinfer.api.server_config import ListenConfig
from uvicorn.protocols.http.h11_impl import H11Protocol

logger = logging.getLogger("sparkinfer.api")

_AFTER_DRAIN_S = 5.0  # for the requests ended at the drain's end to send their last bytes


class HeaderTimeoutProtocol(H11Protocol):
    """uvicorn's h11 protocol with a deadline for each request's headers."""

    def __init__(self, *args: Any, header_timeout_s: float, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._header_timeout_s = header_timeout_s
        self._header_timer: asyncio.TimerHandle | None = None

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._arm_header_timer()

    def on_response_complete(self) -> None:
        super().on_response_complete()
        self._arm_header_timer()

    def connection_lost(self, exc: Exception | None) -> None:
        if self._header_timer is not None:
            self._header_timer.cancel()
        super().connection_lost(exc)

    def _arm_header_timer(self) -> None:
        if self._header_timer is not None:
            self._header_timer.cancel()
        cycle = self.cycle  # a new request replaces it once its headers are complete
        self._header_timer = self.loop.call_later(
            self._header_timeout_s, self._on_header_timeout, cycle
        )

    def _on_header_timeout(self, cycle: object) -> None:
        is_waiting = self.cycle is cycle and (cycle is None or self.cycle.response_complete)
        if is_waiting and not self.transport.is_closing():
            self.transport.close()


class DrainingServer(uvicorn.Server):
    """uvicorn's server whose shutdown drains for a bounded time, then ends what is left."""

    def __init__(
        self, config: uvicorn.Config, *, drain_s: float, on_drain_end: Callable[[], None]
    ) -> None:
        super().__init__(config)
        self._drain_s = drain_s
        self._on_drain_end = on_drain_end

    async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
        for server in self.servers:
            server.close()  # accept nothing new
        for connection in list(self.server_state.connections):
            connection.shutdown()  # idle ones close now, busy ones after their response
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self._drain_s
        while self.server_state.connections and loop.time() < deadline and not self.force_exit:
            await asyncio.sleep(0.05)
        if self.server_state.connections:
            logger.warning(
                "shutdown: %d connections still open after the %g s drain; ending their requests",
                len(self.server_state.connections),
                self._drain_s,
            )
            self._on_drain_end()
        await super().shutdown(sockets)

    @contextlib.contextmanager
    def capture_signals(self) -> Generator[None, None, None]:
        with super().capture_signals():
            yield
            # A drained shutdown is a clean exit (0), not a death by the signal uvicorn would
            # raise again once its handlers are restored.
            self._captured_signals.clear()  # pyright: ignore[reportPrivateUsage]


def build_server(app: FastAPI, listen: ListenConfig) -> DrainingServer:
    """The uvicorn server for `app` with the config's header deadline and drain."""
    protocol = functools.partial(
        HeaderTimeoutProtocol, header_timeout_s=listen.header_read_timeout_s
    )
    config = uvicorn.Config(
        app,
        host=listen.host,
        port=listen.port,
        log_level=listen.log_level,
        http=cast("type[asyncio.Protocol]", protocol),
        timeout_graceful_shutdown=int(_AFTER_DRAIN_S),
    )

    def end_open_requests() -> None:
        server = getattr(app.state, "server", None)
        if server is not None:
            server.engine.end_all(
                EngineUnavailable("the server is shutting down: retry the request")
            )

    return DrainingServer(config, drain_s=listen.shutdown_drain_s, on_drain_end=end_open_requests)
