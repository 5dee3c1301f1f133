"""Run a check in a forked child and return its exit code."""

from __future__ import annotations

import os
import traceback

from dex_celery.forks import after_fork


class Holder:
    def __init__(self) -> None:
        self.state: object | None = object()
        after_fork(self.reset)

    def reset(self) -> None:
        self.state = None


def in_child(check: object) -> int:
    """Fork; the child exits 0 if `check()` is true, 1 otherwise. Returns the exit code."""
    pid = os.fork()
    if pid == 0:  # the child: report and leave at once, running nothing of the parent's
        try:
            os._exit(0 if check() else 1)  # type: ignore[operator]
        except BaseException:
            traceback.print_exc()  # to the test's captured stderr
            os._exit(2)
    _, status = os.waitpid(pid, 0)
    return os.waitstatus_to_exitcode(status)
