"""The one after-fork hook: every piece of per-process state is reset here, nowhere else.

A prefork pool child (billiard), a `multiprocessing` child or a bare `os.fork()` inherits its
parent's memory but not its threads, and must not share its sockets. Each holder of such state
(the SQL engine's pool, the heartbeat pump, the outcome writer, the cached ledger epoch)
registers a reset with `after_fork`; the hook runs them all in the child, before any task.

`os.register_at_fork` is used rather than Celery's `worker_process_init` signal because it also
covers forks Celery does not make (tests, `multiprocessing`), and runs before anything else in
the child can touch the inherited state.

A reset never lets the parent's objects be garbage-collected: it hands them to
`keep_inherited`. Collected later, a socket or SQLite connection closes its file descriptor by
number, and by then that number may be someone else's: Celery's embedded beat (`worker -B`)
closes every inherited descriptor when it starts, and the next file or socket the child opens
takes the lowest free number. A beat whose SQLite file was closed that way under its own
connection failed every sweep with "disk I/O error" (tests/integration/engine/test_beat_embedded.py).
"""

from __future__ import annotations

import logging
import os
import weakref
from collections.abc import Callable

log = logging.getLogger("dex_celery.forks")

#: Each entry returns the reset to run, or None once the object it belongs to is gone.
_resets: list[Callable[[], Callable[[], None] | None]] = []
#: The parent's connection holders this child dropped: referenced for the child's whole life.
_inherited: list[object] = []


def after_fork(reset: Callable[[], None]) -> None:
    """Run `reset()` in every child process forked from now on.

    A bound method is held weakly, so registering an object's reset does not keep it alive.
    """
    if hasattr(reset, "__self__") and hasattr(reset, "__func__"):
        _resets.append(weakref.WeakMethod(reset))
    else:
        _resets.append(lambda: reset)


def keep_inherited(holder: object) -> None:
    """Keep a parent's `holder` (a runtime, an engine, a pool) referenced and unused here, so
    nothing in this child ever closes the descriptors it holds (see the module docstring)."""
    if holder is not None:
        _inherited.append(holder)


def _run_resets() -> None:
    """In the child: run every live reset, drop those whose objects are gone."""
    live = []
    for ref in _resets:
        reset = ref()
        if reset is None:
            continue
        live.append(ref)
        try:
            reset()
        except Exception:  # one holder's failure must not leave the others un-reset
            log.exception("an after-fork reset failed")
    _resets[:] = live


os.register_at_fork(after_in_child=_run_resets)
