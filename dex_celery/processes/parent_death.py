"""Children that die with the process that started them: Linux's parent-death signal.

A process started in a group of its own (`start_new_session=True`) is out of reach of a
Ctrl-C sent to its parent's group, and when the parent is SIGKILLed (a cut CI job, a killed
`pytest`, a killed `dex-celery dev`) nothing of the parent runs to stop it: it lives on with
parent pid 1, a worker still taking messages. `dies_with_parent()` gives `subprocess.Popen` a
`preexec_fn` that asks the kernel (`prctl(PR_SET_PDEATHSIG, SIGKILL)`) to SIGKILL the child when
its parent goes. A Celery worker's own pool processes get the same from Celery (prefork), and
the outcome recorder exits when the worker's pipe closes, so a worker's whole tree goes.

The signal follows the parent *thread* that called `Popen`: start long-lived children from a
thread that lives as long as they should (the main thread, as the test fixtures and `dev` do).
Linux only: elsewhere the function is a no-op, and the process groups the callers kill at
teardown still apply (docs/testing.md, "Processes a test starts").
"""

from __future__ import annotations

import ctypes
import os
import signal
import sys
from collections.abc import Callable

#: `prctl` option (linux/prctl.h).
PR_SET_PDEATHSIG = 1


def dies_with_parent() -> Callable[[], None] | None:
    """A `preexec_fn` for `subprocess.Popen` (None off Linux): the child is SIGKILLed when the
    thread that starts it ends (its process killed, or the thread returned).

    `prctl` is looked up here, in the parent: between `fork` and `exec` the child only calls it
    (no loading of libraries after a fork of a process that may run threads)."""
    if not sys.platform.startswith("linux"):
        return None
    prctl = ctypes.CDLL(None, use_errno=True).prctl
    parent = os.getpid()
    kill = int(signal.SIGKILL)

    def preexec() -> None:
        if prctl(PR_SET_PDEATHSIG, kill, 0, 0, 0) != 0:
            return  # not allowed here: the process groups still apply
        if os.getppid() != parent:  # the parent died before the prctl: nobody left to follow
            os.kill(os.getpid(), kill)

    return preexec
