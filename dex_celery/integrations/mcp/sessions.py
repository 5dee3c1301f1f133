"""Warm MCP sessions: one initialized session per server in each worker process, reused.

Starting a stdio server and greeting it costs hundreds of milliseconds; a `tools/call` on a
session that is already open costs about one. So each process keeps one session per server
(a stdio child process, or a streamable-HTTP session), opened by the first attempt that needs
it and reused by every later one, on every pool thread of the process (MCP sessions carry
concurrent requests).

The honesty rules do not change with reuse:

- Before each `tools/call` the session is checked with a `ping`. A session that fails it is
  dropped and a fresh one opened; if that cannot be done the attempt ends "did not run", since
  nothing was sent.
- Once `tools/call` was sent, a session that breaks makes the attempt lost (`ToolLost`) and is
  dropped, so the next attempt starts a new server.

The sessions live on this module's own event loop thread: the SDK's client is an async context
manager held open by one task, and calls from the worker's threads are handed to that loop.
Nothing here crosses a fork: the after-fork hook (`dex_celery.forks`) gives the child an empty
pool. The parent's sessions are kept referenced, never closed, in the child: closing them there
would stop the parent's server processes.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import math
import threading
from collections.abc import Callable, Coroutine
from dataclasses import dataclass
from typing import Any, Protocol, TypeVar

import anyio
from mcp import Client, MCPError

from dex_celery.async_bridge import LoopThread
from dex_celery.forks import after_fork, keep_inherited
from dex_celery.integrations.mcp.wire import connection_broke

log = logging.getLogger("dex_celery.mcp")

_T = TypeVar("_T")

#: Seconds a liveness `ping` of a warm session may take before the session counts as broken.
PING_TIMEOUT = 5.0


class McpServer(Protocol):
    """What the pool needs of a server (`mcp/client.McpServer`): a name, a time limit for
    opening, a fresh client, and equality (a changed server gets a new session)."""

    @property
    def name(self) -> str: ...

    @property
    def connect_timeout(self) -> float: ...

    def client(self) -> Client: ...


@dataclass(frozen=True, slots=True)
class PoolStats:
    """How many sessions this process opened per server (what the tests and the bench read)."""

    opened: dict[str, int]


class _Session:
    """One open session, held by one task on the pool's loop until `close` or a failure."""

    def __init__(self, server: McpServer) -> None:
        self.server = server
        self.client: Client | None = None
        self.ready = asyncio.Event()
        self.stop = asyncio.Event()
        self.error: BaseException | None = None
        self.ended = False
        self.task: asyncio.Task[None] | None = None

    async def hold(self) -> None:
        try:
            with anyio.fail_after(self.server.connect_timeout) as connecting:
                async with self.server.client() as client:
                    connecting.deadline = math.inf
                    self.client = client
                    self.ready.set()
                    await self.stop.wait()
        except BaseException as e:  # the holder ends; callers see `ended` and `error`
            self.error = e
            if isinstance(e, asyncio.CancelledError):
                raise
        finally:
            self.ended = True
            self.ready.set()

    @property
    def usable(self) -> bool:
        return self.client is not None and not self.ended


class SessionPool:
    """This process's warm sessions, by server name (see the module's docstring)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._loop: LoopThread | None = None
        self._sessions: dict[str, _Session] = {}
        self._opening: dict[str, asyncio.Future[_Session]] = {}
        self._opened: dict[str, int] = {}

    # --- from the worker's threads ---------------------------------------------------------

    def run(self, coroutine: Coroutine[Any, Any, _T], on_cancel: Callable[..., Any]) -> _T:
        """Run `coroutine` on the pool's loop and wait for it; `on_cancel(cancel)` registers
        how the caller's cancellation (a fenced attempt) cancels it."""
        return self._loop_thread().run(coroutine, on_cancel)

    def stats(self) -> PoolStats:
        with self._lock:
            return PoolStats(dict(self._opened))

    def close_all(self) -> None:
        """Close every session: each server sees its session end (a stdio server's stdin
        closed, an HTTP session's `DELETE`). A worker process calls it at its shutdown
        (`processes/worker.py`, through `McpServerTools.close`)."""
        with self._lock:
            loop = self._loop
        if loop is None:
            return
        future: concurrent.futures.Future[None] = loop.submit(self._close_all())
        try:
            future.result(timeout=10)
        except Exception as e:  # closing must never fail the caller
            log.warning("closing the MCP sessions failed: %s", e)

    # --- on the pool's loop ----------------------------------------------------------------

    async def session(self, server: McpServer) -> Client:
        """An open, answering session of `server`: the warm one if it passes its ping, else a
        new one. Raises whatever opening the server raised (nothing was sent then)."""
        current = self._sessions.get(server.name)
        if current is not None and current.server == server and current.usable:
            assert current.client is not None
            try:
                with anyio.fail_after(min(PING_TIMEOUT, server.connect_timeout)):
                    await current.client.session.send_ping()
                return current.client
            except MCPError as e:
                if not connection_broke(e):
                    # It answered (a server may refuse `ping`): the session is alive.
                    return current.client
                log.info("MCP server %s: the warm session failed its ping (%s)", server.name, e)
                self.discard(server, current)
            except BaseException as e:
                if isinstance(e, asyncio.CancelledError):
                    raise
                log.info("MCP server %s: the warm session failed its ping (%s)", server.name, e)
                self.discard(server, current)
        elif current is not None:
            self.discard(server, current)
        return await self._open(server)

    def discard(self, server: McpServer, session: _Session | None = None) -> None:
        """Drop the server's session (it broke); its holder closes it in the background."""
        current = self._sessions.get(server.name)
        if current is None or (session is not None and current is not session):
            return
        del self._sessions[server.name]
        current.stop.set()

    def current(self, server: McpServer) -> _Session | None:
        return self._sessions.get(server.name)

    async def _open(self, server: McpServer) -> Client:
        opening = self._opening.get(server.name)
        if opening is None:
            opening = asyncio.get_running_loop().create_future()
            self._opening[server.name] = opening
            try:
                session = _Session(server)
                session.task = asyncio.get_running_loop().create_task(session.hold())
                await session.ready.wait()
                if not session.usable:
                    assert session.error is not None
                    raise session.error
                with self._lock:
                    self._opened[server.name] = self._opened.get(server.name, 0) + 1
                self._sessions[server.name] = session
                opening.set_result(session)
            except BaseException as e:
                opening.set_exception(e)
                opening.exception()  # retrieved: concurrent openers re-raise it themselves
                raise
            finally:
                self._opening.pop(server.name, None)
        session = await asyncio.shield(opening)
        assert session.client is not None
        return session.client

    async def _close_all(self) -> None:
        sessions, self._sessions = list(self._sessions.values()), {}
        for session in sessions:
            session.stop.set()
        tasks = [s.task for s in sessions if s.task is not None]
        if tasks:
            await asyncio.wait(tasks, timeout=10)

    def _loop_thread(self) -> LoopThread:
        with self._lock:
            if self._loop is None or not self._loop.thread.is_alive():
                self._loop = LoopThread()
            return self._loop


_pool = SessionPool()


def pool() -> SessionPool:
    """This process's session pool."""
    return _pool


def _reset_after_fork() -> None:
    global _pool
    keep_inherited(_pool)
    _pool = SessionPool()


after_fork(_reset_after_fork)
