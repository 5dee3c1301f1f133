"""Children that die with the process that started them: Linux's parent-death signal.

A process started in a group of its own (`start_new_session=True`) is out of reach of a
Ctrl-C sent to its parent's group, and when the parent is SIGKILLed (a cut CI job, a killed
`pytest`, a killed `dex-celery dev`) nothing of the parent runs to stop it: it lives on with
parent pid 1, a worker still taking messages. `popen_with_parent_death` starts the child through
util-linux's `setpriv --pdeathsig KILL`, which asks the kernel (`prctl(PR_SET_PDEATHSIG)`) to
SIGKILL it when its parent goes, then execs the command (same pid; the signal survives the
exec). A Celery worker's own pool processes get the same from Celery (prefork), and the outcome
recorder exits when the worker's pipe closes, so a worker's whole tree goes.

Why not a `preexec_fn` calling `prctl`: Python then runs code in the child between `fork` and
`exec`, which can deadlock when the parent runs threads (a lock another thread held at the fork
is never released in the child). Tests that start workers beside a sweeper thread or a TCP
proxy hung in `Popen` that way; `setpriv` runs no Python in the child.

The signal follows the parent *thread* that called `Popen`: start long-lived children from a
thread that lives as long as they should (the main thread, as the test fixtures and `dev` do).
Without `setpriv` (not Linux, or util-linux missing) the child starts as is, and the process
groups the callers kill at teardown still apply (docs/testing.md, "Processes a test starts").
"""

from __future__ import annotations

import functools
import shutil
import subprocess
import sys
from collections.abc import Sequence
from typing import Any


@functools.cache
def parent_death_prefix() -> tuple[str, ...]:
    """The command prefix that gives a child the parent-death signal; empty where there is none."""
    if not sys.platform.startswith("linux"):
        return ()
    setpriv = shutil.which("setpriv")
    return (setpriv, "--pdeathsig", "KILL", "--") if setpriv else ()


def popen_with_parent_death(args: Sequence[str], **kwargs: Any) -> subprocess.Popen[Any]:
    """`subprocess.Popen(args, **kwargs)` for a child SIGKILLed when the starting thread ends."""
    return subprocess.Popen([*parent_death_prefix(), *args], **kwargs)
