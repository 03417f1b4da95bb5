"""The `sparkinfer-api` command: flags and settings, the listening port, then the server.

Only the settings are imported before the port is bound, so `--help`, a mistyped flag, a bad
value and a port that is taken or not allowed answer in about a second, before torch, the model
and the engine load. Every start-up mistake ends in one line on stderr and exit status 2.
"""

from __future__ import annotations

import errno
import socket
import sys
from collections.abc import Sequence
from typing import NoReturn

from sparkinfer.api.server_config import ListenConfig
from sparkinfer.api.settings import SettingsError, parse_args, server_config

_PORT_ADVICE = {
    errno.EADDRINUSE: "another process listens there: stop it or pass another --port",
    errno.EACCES: "this user may not listen there: pass a --port above 1023",
    errno.EADDRNOTAVAIL: "the address is not one of this machine's: pass --host 127.0.0.1 "
    "(this machine only) or --host 0.0.0.0 (every interface)",
}


def bind_port(listen: ListenConfig) -> socket.socket:
    """A socket bound to the config's host and port, not yet listening (connections are refused
    until the server starts). Raises SettingsError saying what to do when the port is taken,
    not allowed, or the host is not this machine's."""
    where = f"{listen.host}:{listen.port}"
    try:
        family, kind, proto, _, address = socket.getaddrinfo(
            listen.host, listen.port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE
        )[0]
    except socket.gaierror as exc:
        raise SettingsError(
            f"cannot listen on {where}: the host does not resolve ({exc.strerror}); "
            "pass --host 127.0.0.1 or --host 0.0.0.0"
        ) from None
    sock = socket.socket(family, kind, proto)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as uvicorn: restarts rebind
    try:
        sock.bind(address)
    except OSError as exc:
        sock.close()
        advice = _PORT_ADVICE.get(exc.errno or 0, "pass another --port or --host")
        raise SettingsError(f"cannot listen on {where} ({exc.strerror}): {advice}") from None
    return sock


def _fail(exc: BaseException) -> NoReturn:
    """Print `exc` as one line and exit with status 2."""
    print(f"sparkinfer-api: {' '.join(str(exc).split())}", file=sys.stderr)
    raise SystemExit(2) from None


def main(argv: Sequence[str] | None = None) -> None:
    """Parse flags and SPARKINFER_* settings, bind the port, load the model, then serve."""
    try:
        settings, _ = parse_args(argv)
        config = server_config(settings)  # the one frozen tree, handed down whole
        sock = bind_port(config.listen)
    except SettingsError as exc:
        _fail(exc)
    with sock:
        from sparkinfer.api import main as server  # torch, the model, the engine: seconds

        try:
            server.serve(config, sock)
        except server.STARTUP_ERRORS as exc:
            _fail(exc)
