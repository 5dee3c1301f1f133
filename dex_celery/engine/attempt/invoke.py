"""How a tool is invoked inside a worker, the same way on every pool (prefork, threads, gevent).

- A sync tool is called in the task's own thread (or greenlet). One that hands back an awaitable
  is refused with a clear error; its coroutine is closed, never left "never awaited".
- An `async def` tool runs through `async_bridge.run_sync` on an event loop the worker keeps: one
  per pool thread (prefork: the pool process's thread; threads: each thread), reused call after
  call. Under gevent all async tools share the process's one loop, run by a greenlet. The
  heartbeat pump goes on renewing the lease while the tool awaits.
- When the attempt is fenced (its lease was taken away, or it ran past start-to-close) the
  `ToolContext` is cancelled, which cancels the coroutine; a sync tool sees `ctx.cancelled`.
- Start-to-close is enforced here for every pool, not only where Celery has a soft time limit
  (threads and gevent have none): a per-process watchdog fences the attempt in the ledger at its
  deadline (S5.1), records the time-out through `engine/steps.py`, then cancels the tool.
- What the tool returns is bounded and must be JSON (`encode_result`).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import heapq
import inspect
import itertools
import json
import logging
import threading
import time
import traceback
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from celery.exceptions import SoftTimeLimitExceeded

from dex_celery.async_bridge import run_sync
from dex_celery.errors import AttemptCancelled, DexError, ToolError, ToolLost
from dex_celery.forks import after_fork
from dex_celery.ledger.ledger import Cause
from dex_celery.model.effects import traits_of
from dex_celery.tools.arguments import check_arguments
from dex_celery.tools.log_scrub import scrubbing
from dex_celery.tools.sealing import Scrubber, unseal
from dex_celery.tools.tool import Tool, ToolContext

if TYPE_CHECKING:
    from dex_celery.engine.steps import Steps
    from dex_celery.ledger.ledger import Ledger
    from dex_celery.settings import Settings

log = logging.getLogger("dex_celery.engine.attempt.worker")

#: Exceptions a tool raises that mean "try again later" without being a ToolError.
TRANSIENT_ERRORS: tuple[type[BaseException], ...] = (ConnectionError, TimeoutError)

#: Seconds after the start-to-close deadline the watchdog acts: the ledger decides with Redis's
#: clock (S10.1), so acting a little late avoids a refused early time-out.
WATCHDOG_SLACK = 0.05

#: Characters of an oversized result kept as a preview in the record.
PREVIEW_CHARS = 500


def is_async(fn: Callable[..., Any]) -> bool:
    """An `async def` function, or a callable object whose `__call__` is one."""
    if inspect.iscoroutinefunction(fn):
        return True
    call = getattr(fn, "__call__", None)  # noqa: B004 - the attribute, not callable()
    return call is not None and inspect.iscoroutinefunction(call)


# --- start-to-close watchdog ---------------------------------------------------------------


class Watchdog:
    """Calls `action` of each attempt still running at its deadline; one thread per process."""

    def __init__(self) -> None:
        self._heap: list[tuple[float, int, Callable[[], None]]] = []
        self._cancelled: set[int] = set()
        self._ids = itertools.count()
        self._cond = threading.Condition()
        self._thread = threading.Thread(target=self._loop, name="dex-watchdog", daemon=True)
        self._thread.start()

    def add(self, delay: float, action: Callable[[], None]) -> int:
        deadline = time.monotonic() + delay
        with self._cond:
            ident = next(self._ids)
            # Wake the thread only for a deadline earlier than the one it sleeps towards: with
            # one start-to-close for most tools that is almost never, so no switch per call.
            earliest = not self._heap or deadline < self._heap[0][0]
            heapq.heappush(self._heap, (deadline, ident, action))
            if earliest:
                self._cond.notify()
            return ident

    def remove(self, ident: int) -> None:
        with self._cond:
            self._cancelled.add(ident)
            if len(self._cancelled) > 1024 and len(self._cancelled) * 2 > len(self._heap):
                # Most entries are of attempts that ended: rebuild without them.
                self._heap = [e for e in self._heap if e[1] not in self._cancelled]
                heapq.heapify(self._heap)
                self._cancelled.clear()

    def _loop(self) -> None:
        while True:
            with self._cond:
                while True:
                    # Entries are popped when due; a removed one is dropped then (or by the
                    # rebuild in `remove`). Dropping removed entries as soon as the thread wakes
                    # would empty the heap between attempts, so that every `add` found it empty
                    # and woke the thread again: a thread switch on most calls.
                    if self._heap and self._heap[0][0] <= time.monotonic():
                        _, ident, action = heapq.heappop(self._heap)
                        if ident in self._cancelled:
                            self._cancelled.discard(ident)
                            continue
                        break
                    self._cond.wait(self._heap[0][0] - time.monotonic() if self._heap else None)
            try:
                action()
            except Exception:  # the sweeper times the attempt out later; keep watching others
                log.exception("start-to-close watchdog action failed")


_watchdog: Watchdog | None = None
_watchdog_lock = threading.Lock()


def watchdog() -> Watchdog:
    global _watchdog
    with _watchdog_lock:
        if _watchdog is None:
            _watchdog = Watchdog()
        return _watchdog


def overtime_action(
    ledger: Ledger, steps: Steps, key: str, attempt: int, ctx: ToolContext
) -> Callable[[], None]:
    """Fence then cancel: what happens when an attempt reaches its start-to-close deadline."""

    def act() -> None:
        step = ledger.time_out(
            key, attempt, detail="the start-to-close timeout was reached (worker watchdog)"
        )
        if step.kind.value != "noop":
            log.warning("attempt %d of %s ran past start-to-close; cancelling it", attempt, key)
            steps.apply(key, step)
            ctx.cancel()

    return act


# --- invoking --------------------------------------------------------------------------------


def invoke(
    tool: Tool,
    ctx: ToolContext,
    kwargs: dict[str, Any],
    *,
    scrubber: Scrubber,
    limit: int,
    effect: str | None = None,
) -> tuple[Cause, str]:
    """Run the tool once and turn what happened into the ledger's (cause, payload)."""
    try:
        if is_async(tool.function):
            value = _await(tool, ctx, kwargs)
        else:
            value = tool.function(ctx, **kwargs)
            if inspect.isawaitable(value):
                if inspect.iscoroutine(value):
                    value.close()
                return Cause.TOOL_ERROR, (
                    f"tool {tool.name!r} is a plain function that returned an awaitable, which "
                    "was not run; declare the tool with `async def`"
                )
    except SoftTimeLimitExceeded:
        return Cause.TIMED_OUT, "the soft time limit (start-to-close) was reached"
    except (AttemptCancelled, asyncio.CancelledError, concurrent.futures.CancelledError):
        return Cause.TIMED_OUT, "the attempt was fenced (timed out or presumed lost) and cancelled"
    except ToolLost as e:
        return Cause.LOST, scrubber.text(e.message)
    except ToolError as e:
        return (Cause.RETRYABLE if e.retryable else Cause.TOOL_ERROR), scrubber.text(e.message)
    except TRANSIENT_ERRORS as e:
        return Cause.RETRYABLE, scrubber.text(f"{type(e).__name__}: {e}")
    except Exception as e:
        text = scrubber.text("".join(traceback.format_exception(e)))
        log.error("tool %s raised:\n%s", tool.name, text)
        return Cause.TOOL_ERROR, scrubber.text(f"{type(e).__name__}: {e}")
    return encode_result(tool, value, scrubber=scrubber, limit=limit, effect=effect)


def _await(tool: Tool, ctx: ToolContext, kwargs: dict[str, Any]) -> Any:
    """On the loop this pool thread keeps (`async_bridge`), cancelled when the attempt is."""
    return run_sync(tool.function(ctx, **kwargs), on_cancel=ctx.on_cancel, keep_loop=True)


def encode_result(
    tool: Tool, value: Any, *, scrubber: Scrubber, limit: int, effect: str | None = None
) -> tuple[Cause, str]:
    """The result as JSON text within `limit` bytes, or a record of why it is not kept.

    A read-only class (its row of `model/effects.py`) that returned something unusable failed (running it changed nothing). Any other
    tool ran and its effect may have taken place: that call succeeded, and its result says the
    return value was not kept, so nobody reads "failed" and calls the write again.
    """
    declared = effect or tool.effect_hint
    read = declared is not None and traits_of(declared).read_only
    try:
        text = json.dumps(scrubber.value(value), allow_nan=False)
    except (TypeError, ValueError) as e:
        problem = f"the tool returned a value that is not JSON ({type(value).__name__}: {e})"
        if read:
            return Cause.TOOL_ERROR, scrubber.text(problem)
        return Cause.OK, json.dumps(
            {
                "result_not_kept": scrubber.text(
                    problem + "; the tool finished, so its effect took place"
                )
            }
        )
    size = len(text.encode())
    if size <= limit:
        return Cause.OK, text
    problem = (
        f"the tool's result was {size} bytes, over the limit of {limit} bytes "
        "(max_result_bytes), and was not kept"
    )
    if read:
        return Cause.TOOL_ERROR, problem + "; ask for less (a narrower query or a page)"
    return Cause.OK, json.dumps(
        {
            "result_not_kept": problem + "; the tool finished, so its effect took place",
            "bytes": size,
            "preview": text[: min(PREVIEW_CHARS, limit // 4)],
        }
    )


# --- one attempt, from the message's fields --------------------------------------------------


def stored_arguments(arguments: str | dict[str, Any]) -> dict[str, Any]:
    """The arguments as the message carries them: canonical JSON text (secrets `***`).

    Text, not an object: Kombu's JSON decoder turns any `{"__type__", "__value__"}` object into
    a Python value (or fails on an unknown marker), so an object would not reach the tool as
    validated and could poison the message. A dict is still accepted from older messages.
    """
    if isinstance(arguments, str):
        value = json.loads(arguments)
        return dict(value) if isinstance(value, dict) else {}
    return dict(arguments)


def invoke_attempt(
    ledger: Ledger,
    steps: Steps,
    settings: Settings,
    tool: Tool,
    ctx: ToolContext,
    arguments: str | dict[str, Any],
    sealed: str | None,
    *,
    start_to_close: float,
    effect: str | None = None,
) -> tuple[Cause, str]:
    """Open the sealed secrets, check the arguments, run the tool under the watchdog.

    `effect`: the call's effect class as the claim reported it (the tool's own hint otherwise).
    """
    scrubber = Scrubber()
    try:
        shown = stored_arguments(arguments)
        secrets = unseal(sealed, settings.secret_key)
        scrubber = Scrubber(secrets)
        kwargs = check_arguments(tool, {**shown, **secrets})
    except DexError as e:
        # The tool was not called: its signature changed since the request, or the key differs.
        return Cause.TOOL_ERROR, scrubber.text(f"the tool was not called: {e}")
    guard = None
    if start_to_close > 0:
        action = overtime_action(ledger, steps, ctx.call.key, ctx.attempt, ctx)
        guard = watchdog().add(start_to_close + WATCHDOG_SLACK, action)
    try:
        with scrubbing(scrubber):  # the tool's own log lines and prints, too (log_scrub.py)
            return invoke(
                tool, ctx, kwargs, scrubber=scrubber, limit=settings.max_result_bytes, effect=effect
            )
    finally:
        if guard is not None:
            watchdog().remove(guard)


def _forget_process_state() -> None:
    """After a fork (`dex_celery.forks`): the child has none of the parent's threads, so its
    watchdog is made anew on first use (the loops are `async_bridge`'s)."""
    global _watchdog, _watchdog_lock
    _watchdog = None
    _watchdog_lock = threading.Lock()


after_fork(_forget_process_state)
