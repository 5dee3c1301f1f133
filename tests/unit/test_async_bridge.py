"""`dex_celery.async_bridge`: the one way sync code runs a coroutine, from a thread with no loop,
from inside a running loop's thread, and in a forked child."""

from __future__ import annotations

import asyncio
import gc
import signal
import threading
import weakref
from collections.abc import Iterator
from typing import Any

import pytest

from dex_celery import async_bridge, forks
from dex_celery.async_bridge import process_loop, run_sync
from tests.support.faults.forks import in_child


@pytest.fixture(autouse=True)
def _close_the_loops_made_here() -> Iterator[None]:
    """Close the loops a test leaves in this process, so later tests find the descriptors as
    they were (tests/unit/test_forks.py closes descriptors by number in a child)."""
    yield
    kept: asyncio.AbstractEventLoop | None = getattr(async_bridge._local, "loop", None)
    if kept is not None:
        kept.close()
    running = async_bridge._process_loop
    if running is not None:
        running.loop.call_soon_threadsafe(running.loop.stop)
        running.thread.join(10)
        running.loop.close()


async def _loop_and_thread() -> tuple[asyncio.AbstractEventLoop, str]:
    await asyncio.sleep(0)
    return asyncio.get_running_loop(), threading.current_thread().name


def test_a_thread_with_no_loop_runs_it_on_a_fresh_loop_closed_afterwards() -> None:
    def in_thread() -> list[Any]:
        return [run_sync(_loop_and_thread()), run_sync(_loop_and_thread())]

    result: list[Any] = []
    thread = threading.Thread(target=lambda: result.extend(in_thread()), name="plain")
    thread.start()
    thread.join(10)
    (first, first_thread), (second, second_thread) = result
    assert first_thread == second_thread == "plain"
    assert first is not second
    assert first.is_closed() and second.is_closed()


def test_keep_loop_reuses_the_loop_this_thread_keeps() -> None:
    first, _ = run_sync(_loop_and_thread(), keep_loop=True)
    second, _ = run_sync(_loop_and_thread(), keep_loop=True)
    assert first is second is async_bridge.thread_loop()
    assert not first.is_closed()


def test_inside_a_running_loop_it_runs_elsewhere_and_the_callers_loop_is_not_reentered() -> None:
    async def caller() -> tuple[asyncio.AbstractEventLoop, asyncio.AbstractEventLoop, str]:
        mine = asyncio.get_running_loop()
        theirs, thread = run_sync(_loop_and_thread())  # sync code called from async code
        return mine, theirs, thread

    mine, theirs, thread = asyncio.run(caller())
    assert theirs is not mine
    assert thread != threading.current_thread().name


def test_a_timeout_cancels_it() -> None:
    with pytest.raises(TimeoutError):
        run_sync(asyncio.sleep(30), timeout=0.05)


def test_on_cancel_hands_the_caller_a_way_to_cancel_it_from_another_thread() -> None:
    cancels: list[Any] = []
    started = threading.Event()

    async def waits() -> None:
        started.set()
        await asyncio.sleep(30)

    def cancel_once_started() -> None:
        started.wait(10)
        cancels[0]()

    canceller = threading.Thread(target=cancel_once_started)
    canceller.start()
    with pytest.raises(asyncio.CancelledError):
        run_sync(waits(), on_cancel=cancels.append, keep_loop=True)
    canceller.join(10)


def test_an_exception_raised_into_the_waiting_thread_cancels_the_coroutine() -> None:
    """What prefork's soft time limit does: a signal handler raises in the waiting thread."""
    ended: list[str] = []

    async def waits() -> None:
        try:
            await asyncio.sleep(30)
        except asyncio.CancelledError:
            ended.append("cancelled")
            raise

    class Interrupt(Exception):
        pass

    def raise_interrupt(_signum: int, _frame: object) -> None:
        raise Interrupt

    previous = signal.signal(signal.SIGALRM, raise_interrupt)
    signal.setitimer(signal.ITIMER_REAL, 0.05)
    try:
        with pytest.raises(Interrupt):
            run_sync(waits(), keep_loop=True)
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
    assert ended == ["cancelled"]


def test_after_a_fork_the_child_makes_its_own_loops_and_keeps_the_parents() -> None:
    parent_kept, _ = run_sync(_loop_and_thread(), keep_loop=True)
    parent_thread = process_loop()
    kept = weakref.ref(parent_kept)

    def child_has_its_own_loops() -> bool:
        gc.collect()  # the parent's loops must not be collected (their descriptors are reused)
        child_kept, _ = run_sync(_loop_and_thread(), keep_loop=True)
        on_thread = process_loop().run(_loop_and_thread())
        return (
            child_kept is not parent_kept
            and not child_kept.is_closed()
            and process_loop() is not parent_thread
            and on_thread[0] is process_loop().loop
            and kept() is not None
            and parent_thread in forks._inherited
        )

    assert in_child(child_has_its_own_loops) == 0
    assert run_sync(_loop_and_thread(), keep_loop=True)[0] is parent_kept
    assert process_loop() is parent_thread
