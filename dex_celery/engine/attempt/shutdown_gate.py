"""The worker's gate before every claim: shut once its warm shutdown begins (docs/reliability.md,
"Deploys: what a worker does on SIGTERM").

The main process receives SIGTERM; the claims are made in the pool processes (prefork) or the
pool's threads. The gate is one byte of memory shared by all of them: an anonymous shared
mapping made in the main process before the pool forks, so a forked pool process reads the
byte its parent writes, without a pipe or a Redis round trip. A delivery that meets the shut
gate is handed back to the broker unclaimed (Celery's `Reject(requeue=True)`), so another
worker runs it: no tool code ran, and a write that never reached its claim runs elsewhere,
once (S3.2, S3.3).
"""

from __future__ import annotations

import mmap
import time

#: Longest single sleep of `wait_open`: a retry's backoff waited out before its claim is cut
#: short this soon after the gate shuts.
POLL = 0.1


class ShutdownGate:
    """One byte shared with every pool process: 0 while the worker claims, 1 once it stops."""

    def __init__(self) -> None:
        # MAP_SHARED (mmap's default) and anonymous: a forked child shares this very page.
        self._byte = mmap.mmap(-1, 1)

    def shut(self) -> None:
        """The worker's warm shutdown began: no new claims in any of its processes."""
        self._byte[0] = 1

    @property
    def shut_already(self) -> bool:
        return self._byte[0] == 1

    def sleep(self, seconds: float) -> bool:
        """Sleep up to `seconds`, waking early when the gate shuts; True if it is still open."""
        deadline = time.monotonic() + seconds
        while not self.shut_already:
            left = deadline - time.monotonic()
            if left <= 0:
                return True
            time.sleep(min(POLL, left))
        return False
