"""The inner run of tests/integration/testing/test_cut_runs.py (not collected on its own: the
outer test names this file to a pytest of its own, then cuts that run short).

`test_fails_first` fails; `test_blocks_with_a_worker` starts what the project's tests start (a
private redis-server, through the session fixture, and a prefork worker of the test tools),
writes their pids to `$CUT_RUN_MARK` (the sign it is mid-test) and blocks until it is stopped.
"""

from __future__ import annotations

import faulthandler
import json
import os
import signal
import threading
from collections.abc import Callable
from pathlib import Path

from devtools.processes import RedisServer, Worker, wait_for
from dex_celery import Dex

MARK_ENV = "CUT_RUN_MARK"

#: Where the run writes its threads' stacks when it gets SIGUSR1 (`STACKS_SIGNAL`): the outer
#: test asks for them when a stopped run does not end.
STACKS_SIGNAL = signal.SIGUSR1
_stacks: list[object] = []


def test_fails_first() -> None:
    raise AssertionError("fails on purpose: the outer test looks for its name")


def test_blocks_with_a_worker(
    dex: Dex, redis_server: RedisServer, start_worker: Callable[..., Worker]
) -> None:
    worker = start_worker(concurrency=2)
    wait_for(lambda: len(worker.children()) >= 2, timeout=60, what="the pool processes")
    recorder = worker.recorder()
    assert redis_server.process is not None
    pids = [worker.pid, *worker.children(), redis_server.process.pid]
    pids += [recorder] if recorder is not None else []
    mark = Path(os.environ[MARK_ENV])
    stacks = mark.with_suffix(".stacks").open("w")
    _stacks.append(stacks)  # kept open for the rest of the run
    faulthandler.register(STACKS_SIGNAL, file=stacks, all_threads=True)
    mark.with_suffix(".tmp").write_text(json.dumps(pids))
    mark.with_suffix(".tmp").rename(mark)
    threading.Event().wait(600)  # the outer test stops this run long before
