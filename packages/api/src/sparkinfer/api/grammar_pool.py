"""Grammar compiles from client schemas, each in a process of its own, killed at its deadline.

An xgrammar compile cannot be stopped from another thread, so a schema that takes minutes would
hold its thread for minutes after its request gave up. Here each compile runs in a child forked
from the server (it shares the already-built tokenizer tables, so it starts in milliseconds),
sends the compiled grammar back serialized, and exits; at the deadline the child is killed and
its slot is free at once. At most `num_workers` compiles run at a time, and one client (an API
key, else an address) holds at most `per_client` of them, so one client's schemas cannot keep
everyone else's structured output waiting.
"""

from __future__ import annotations

import asyncio
import contextlib
import multiprocessing
import multiprocessing.connection
from collections.abc import AsyncGenerator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

import xgrammar as xgr
from xgrammar.structural_tag import StructuralTag

_FORK = multiprocessing.get_context("fork")


class CompileFailed(ValueError):
    """xgrammar refused the grammar (`reason`: its message)."""


class CompileTimedOut(TimeoutError):
    """The compile, waiting included, ran past its deadline (its process was killed)."""


def _compile_child(
    conn: multiprocessing.connection.Connection, info: xgr.TokenizerInfo, tag_json: str
) -> None:
    """In the child: compile, send ("ok", grammar JSON) or ("error", message), exit."""
    try:
        compiler = xgr.GrammarCompiler(info, max_threads=1, cache_enabled=False)
        grammar = compiler.compile_structural_tag(StructuralTag.model_validate_json(tag_json))
        conn.send(("ok", grammar.serialize_json()))
    except Exception as exc:
        conn.send(("error", str(exc)))
    finally:
        conn.close()


def _run_child(info: xgr.TokenizerInfo, tag_json: str, timeout_s: float | None) -> str:
    """Fork, wait for the child's answer up to `timeout_s`, kill it if it is late (blocking)."""
    parent, child = _FORK.Pipe(duplex=False)
    proc = _FORK.Process(target=_compile_child, args=(child, info, tag_json), daemon=True)
    proc.start()
    child.close()
    try:
        if not parent.poll(timeout_s):
            raise CompileTimedOut(f"it took longer than {timeout_s:g} s to compile")
        status, payload = parent.recv()
    except EOFError:
        raise CompileFailed(f"the compile process died (exit code {proc.exitcode})") from None
    finally:
        parent.close()
        proc.kill()
        proc.join()
    if status != "ok":
        raise CompileFailed(payload)
    return payload


@dataclass
class _Shares:
    """How many compiles each client runs or waits for; at most `per_client` run at once."""

    per_client: int
    semaphores: dict[str, asyncio.Semaphore] = field(default_factory=dict[str, asyncio.Semaphore])
    users: dict[str, int] = field(default_factory=dict[str, int])

    @contextlib.asynccontextmanager
    async def slot(self, client: str) -> AsyncGenerator[None, None]:
        sem = self.semaphores.setdefault(client, asyncio.Semaphore(self.per_client))
        self.users[client] = self.users.get(client, 0) + 1
        try:
            async with sem:
                yield
        finally:
            self.users[client] -= 1
            if self.users[client] == 0:
                del self.users[client], self.semaphores[client]


class CompilePool:
    """Runs compiles in killable processes: `num_workers` at once, `per_client` per client."""

    def __init__(self, info: xgr.TokenizerInfo, *, num_workers: int, per_client: int) -> None:
        self._info = info
        self._threads = ThreadPoolExecutor(num_workers, thread_name_prefix="grammar-wait")
        self._running: asyncio.Semaphore | None = None  # made on the event loop
        self._num_workers = num_workers
        self._shares = _Shares(min(per_client, num_workers))

    async def compile(
        self, tag: StructuralTag, *, client: str, timeout_s: float | None
    ) -> xgr.CompiledGrammar:
        """The compiled grammar; `CompileTimedOut` past `timeout_s` seconds (waiting for a
        free slot included), `CompileFailed` when xgrammar refuses it."""
        if self._running is None:
            self._running = asyncio.Semaphore(self._num_workers)
        loop = asyncio.get_running_loop()
        deadline = None if timeout_s is None else loop.time() + timeout_s
        try:
            async with asyncio.timeout_at(deadline), self._shares.slot(client), self._running:
                left = None if deadline is None else max(0.0, deadline - loop.time())
                payload = await loop.run_in_executor(
                    self._threads, _run_child, self._info, tag.model_dump_json(), left
                )
        except TimeoutError:
            raise CompileTimedOut(f"it took longer than {timeout_s:g} s to compile") from None
        return await loop.run_in_executor(
            self._threads, xgr.CompiledGrammar.deserialize_json, payload, self._info
        )

    def close(self) -> None:
        self._threads.shutdown(wait=False, cancel_futures=True)
