"""The one way synchronous code runs a coroutine: `run_sync`, and the loops it uses.

Celery tasks, the CLI and the beat jobs are synchronous; async tools, async outcome checks and
the MCP SDK are not. Every hand-over between the two goes through here, so that each of these
holds in one place only:

- A thread with no running loop runs the coroutine on a loop of its own: a fresh one closed
  afterwards (as `asyncio.run` does), or, with `keep_loop=True`, the loop this thread keeps
  call after call (a worker's pool thread: an async tool then costs no hand-off between
  threads).
- A thread whose loop is running (sync code called from async code) never re-enters that
  loop: the coroutine runs on a fresh loop in a fresh thread, and the caller's thread waits.
- Under gevent all greenlets share one OS thread, and asyncio allows one running loop per OS
  thread: every coroutine then runs on the process's one loop thread (`process_loop`), whose
  thread is a greenlet cooperating with the hub (`threading` is patched).
- `on_cancel(cancel)` registers how the caller cancels the coroutine from another thread (a
  fenced attempt, docs/semantics.md S5.1); an exception raised into the waiting thread (prefork's
  soft time limit arrives as a signal) cancels the coroutine too before it propagates.
- After a fork (`dex_celery.forks`) the child has none of its parent's threads: its loops are
  made anew on first use, and the parent's are kept referenced, never collected, since
  collecting them would close descriptor numbers the child may have reused (`keep_inherited`).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import sys
import threading
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any, TypeVar

from dex_celery.forks import after_fork, keep_inherited

_T = TypeVar("_T")

#: How a caller learns the way to cancel the coroutine: it is handed a no-argument callable.
OnCancel = Callable[[Callable[[], Any]], Any]


class LoopThread:
    """An asyncio loop run forever by one daemon thread, for coroutines that outlive a call
    (the process loop under gevent, the MCP session pool's sessions)."""

    def __init__(self, name: str = "dex-asyncio") -> None:
        self.loop = asyncio.new_event_loop()
        ready = threading.Event()

        def run() -> None:
            asyncio.set_event_loop(self.loop)
            self.loop.call_soon(ready.set)
            self.loop.run_forever()

        self.thread = threading.Thread(target=run, name=name, daemon=True)
        self.thread.start()
        ready.wait(10)

    def submit(self, coroutine: Coroutine[Any, Any, _T]) -> concurrent.futures.Future[_T]:
        return asyncio.run_coroutine_threadsafe(coroutine, self.loop)

    def run(self, coroutine: Coroutine[Any, Any, _T], on_cancel: OnCancel | None = None) -> _T:
        """Run `coroutine` on this loop and wait for it in the calling thread."""
        future = self.submit(coroutine)
        if on_cancel is not None:
            on_cancel(future.cancel)
        try:
            return future.result()
        except BaseException:
            # Prefork's soft time limit lands here, in the waiting thread: stop the coroutine too.
            future.cancel()
            raise


_process_loop: LoopThread | None = None
_lock = threading.Lock()
_local = threading.local()


def process_loop() -> LoopThread:
    """This process's loop thread (re-made in a forked child, which has no threads)."""
    global _process_loop
    with _lock:
        if _process_loop is None or not _process_loop.thread.is_alive():
            _process_loop = LoopThread()
        return _process_loop


def thread_loop() -> asyncio.AbstractEventLoop:
    """The loop this thread keeps for `run_sync(..., keep_loop=True)`."""
    loop: asyncio.AbstractEventLoop | None = getattr(_local, "loop", None)
    if loop is None or loop.is_closed():
        loop = asyncio.new_event_loop()
        _local.loop = loop
    return loop


def run_sync(
    awaitable: Awaitable[_T],
    *,
    timeout: float | None = None,
    on_cancel: OnCancel | None = None,
    keep_loop: bool = False,
) -> _T:
    """Run `awaitable` from synchronous code and return its result (see the module docstring).

    `timeout`: seconds before it is cancelled with `TimeoutError`. `keep_loop`: use the loop this
    thread keeps rather than a fresh one; for long-lived threads only (a worker's pool threads).
    """
    coroutine = _bounded(awaitable, timeout)
    if gevent_patched():
        return process_loop().run(coroutine, on_cancel)
    if _loop_running_here():
        # Never re-enter the caller's loop: run on a fresh loop in a fresh thread.
        with concurrent.futures.ThreadPoolExecutor(max_workers=1) as pool:
            return pool.submit(_run_here, coroutine, on_cancel, False).result()
    return _run_here(coroutine, on_cancel, keep_loop)


async def _bounded(awaitable: Awaitable[_T], timeout: float | None) -> _T:
    if timeout is None:
        return await awaitable
    return await asyncio.wait_for(awaitable, timeout)


def _run_here(
    coroutine: Coroutine[Any, Any, _T], on_cancel: OnCancel | None, keep_loop: bool
) -> _T:
    if keep_loop:
        return _run_on(thread_loop(), coroutine, on_cancel)
    with asyncio.Runner() as runner:  # closes the loop afterwards, as `asyncio.run` does
        return _run_on(runner.get_loop(), coroutine, on_cancel)


def _run_on(
    loop: asyncio.AbstractEventLoop,
    coroutine: Coroutine[Any, Any, _T],
    on_cancel: OnCancel | None,
) -> _T:
    task = loop.create_task(coroutine)
    if on_cancel is not None:

        def cancel() -> None:
            with contextlib.suppress(RuntimeError):  # the loop is closed: nothing to cancel
                loop.call_soon_threadsafe(task.cancel)

        on_cancel(cancel)
    try:
        return loop.run_until_complete(task)
    except BaseException:
        # Prefork's soft time limit lands in this thread, inside the loop: stop the coroutine.
        if not task.done():
            task.cancel()
            with contextlib.suppress(BaseException):
                loop.run_until_complete(task)
        raise


def _loop_running_here() -> bool:
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return False
    return True


def gevent_patched() -> bool:
    """gevent has patched `threading`: greenlets share one OS thread, so one asyncio loop."""
    monkey = sys.modules.get("gevent.monkey")
    return monkey is not None and bool(monkey.is_module_patched("threading"))


def _forget_process_state() -> None:
    """In a forked child: no loop thread runs, and this thread's kept loop is the parent's."""
    global _process_loop, _lock, _local
    keep_inherited(_process_loop)  # its selector and wake-up pipe are descriptors
    keep_inherited(_local)  # so are those of the loops the parent's threads kept
    _process_loop = None
    _lock = threading.Lock()
    _local = threading.local()


after_fork(_forget_process_state)
