"""The first two rows of the crash table (docs/ledger.md): the requesting process dies between the SQL
insert and the publish, and the broker refuses the message.

Both end with a record that says the truth about whether the tool ran (S4.1, S4.2): the first
call is opened by the sweeper and runs once; the second never reached a worker, so it is
`failed` with the did-not-run error.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import threading
from collections.abc import Callable
from pathlib import Path

import pytest

from devtools.processes import ROOT, Worker, free_port, wait_for
from devtools.toolapp import LOG_ENV, make_app
from dex_celery import DID_NOT_RUN, CallStatus, Dex, Settings
from dex_celery.engine.upkeep.sweep import run_forever
from tests.support.faults.crash import lines, tool_messages, wait_finished

pytestmark = pytest.mark.crash

#: The requesting process: records the call, then stops dead before the ledger open.
REQUESTER = textwrap.dedent(
    """
    import pathlib, sys, threading
    from dex_celery.engine.request.opening import Opener
    from devtools.toolapp import dex

    def stuck(self, records, *arguments):
        pathlib.Path(sys.argv[1]).write_text("recorded")
        threading.Event().wait()

    Opener.start_new = stuck
    dex.client().request_call("s1", "t1", "c1", "slow_non_idempotent_write", {"seconds": 0})
    """
)


def test_requester_killed_after_the_insert_is_opened_by_the_sweeper_and_runs_once(
    dex: Dex, env: dict[str, str], start_worker: Callable[..., Worker], tmp_path: Path
) -> None:
    marker = tmp_path / "recorded"
    requester = subprocess.Popen(
        [sys.executable, "-c", REQUESTER, str(marker)],
        cwd=ROOT,
        env={**os.environ, **env},
        start_new_session=True,
    )
    try:
        wait_for(marker.exists, timeout=60, what="the requester to record the call")
    finally:
        os.killpg(requester.pid, signal.SIGKILL)
        requester.wait(timeout=10)

    key = "s1/t1/c1"
    record = dex.store.get_call(key)
    assert record is not None and record.status is CallStatus.PENDING
    assert dex.ledger.read(key) is None, "the requester died before the ledger open"

    start_worker()
    stop = threading.Event()
    sweeper = threading.Thread(target=run_forever, args=(dex,), kwargs={"stop": stop})
    sweeper.start()
    try:
        done = wait_finished(dex, key, timeout=60)
    finally:
        stop.set()
        sweeper.join(timeout=10)

    assert done.status is CallStatus.SUCCEEDED
    assert [attempt for attempt, _pid, _key in lines(key, "start")] == [1]
    assert len(tool_messages(dex, key)) == 1


@pytest.mark.parametrize(
    ("tool", "attempts"),
    [("slow_non_idempotent_write", 1), ("flaky_read", 3)],
)
def test_broker_refusing_every_publish_ends_the_call_as_never_run(
    env: dict[str, str], tool: str, attempts: int
) -> None:
    # The ledger's Redis is up; the broker's address has nothing listening.
    settings = Settings.from_env(env, broker_url=f"redis://127.0.0.1:{free_port()}/0")
    _app, dex = make_app(settings)
    dex.store.create_schema()

    record = dex.client().request_call("s1", "t1", "c1", tool, {})

    done = dex.store.get_call(record.key)
    assert done is not None and done.status is CallStatus.FAILED
    assert (done.error or "").startswith(DID_NOT_RUN)
    assert done.attempts == attempts  # a read is retried, then gives up; a write never is
    assert len(tool_messages(dex, record.key)) == 1
    assert not (Path(env[LOG_ENV]) / (record.key.replace("/", "__") + ".log")).exists()
