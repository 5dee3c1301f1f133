"""Version skew during a rolling deploy (docs/reliability.md, "Deploys"): requesters of the new
release ask for a tool (`audit`) that the running workers, of the previous release, do not have.

Real processes: a worker started from an app module that lacks the tool, then one from a module
that has it (`tests/support/apps/skew_apps.py`). The old worker hands each message back instead of
dropping it, the call says why it waits, a call whose schedule-to-start deadline passes before
any capable worker comes ends "did not run" with that reason, and once a capable worker runs it
runs the call under the call's recorded policy snapshot (S1.5), once.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from devtools.processes import CeleryWorker, wait_for
from devtools.toolapp import LOG_ENV, NEW_TOOL, make_app
from dex_celery import DID_NOT_RUN, CallStatus, Dex, Settings
from dex_celery.ops.present import call_details
from tests.support.faults.crash import finished_events, lines, tool_messages, wait_finished
from tests.support.faults.rabbitmq import ON_BOTH_BROKERS

WAITING = "no running worker has this tool yet"


@pytest.fixture
def skew_workers(env: dict[str, str]) -> Iterator[dict[str, CeleryWorker]]:
    """Workers of `tests.support.apps.skew_apps` (`old`, `new`), started by the test, always stopped."""
    started: dict[str, CeleryWorker] = {}
    yield started
    for worker in started.values():
        worker.stop()


def start(env: dict[str, str], workers: dict[str, CeleryWorker], release: str) -> CeleryWorker:
    worker = CeleryWorker(
        f"tests.support.apps.skew_apps:{release}", env, Path(env[LOG_ENV]), concurrency=1
    )
    workers[release] = worker.start()
    return worker


def waiting_note(dex: Dex, key: str) -> str:
    """What `calls show` says of the call's attempt waiting in the queue."""
    record = dex.store.get_call(key)
    assert record is not None
    return " ".join(str(a.get("note") or "") for a in call_details(dex, record)["attempt_log"])


@ON_BOTH_BROKERS
def test_a_tool_the_running_workers_lack_waits_for_one_that_has_it(
    dex: Dex,
    env: dict[str, str],
    skew_workers: dict[str, CeleryWorker],
    sweeper: threading.Event,
) -> None:
    client = dex.client()
    old = start(env, skew_workers, "old")

    # No capable worker comes: the deadline (5 s here) ends the call honestly, with the reason.
    lonely = client.request_call("s1", "t1", "lonely", NEW_TOOL, {"seconds": 1.5})
    wait_for(
        lambda: WAITING in waiting_note(dex, lonely.key),
        timeout=10,
        what="the old worker to say on the call why it waits",
    )
    done = wait_finished(dex, lonely.key, timeout=20)
    assert done.status is CallStatus.FAILED, done
    assert (done.error or "").startswith(DID_NOT_RUN), done.error
    assert WAITING in (done.error or "")
    assert WAITING in tool_messages(dex, lonely.key)[0]
    assert lines(lonely.key, "start") == []
    assert "Received unregistered task" not in old.log()
    assert "handing it back to the queue" in old.log()
    # Handed back once per delay, never in a tight loop: at most a few passes in 5 s.
    assert old.log().count(f"{lonely.key} is for tool") <= 12, old.log()[-3000:]
    wait_for(
        lambda: (
            "waits no more; its held message is dropped" in old.log()
            or "stale message" in old.log()
        ),
        timeout=10,
        what="the old worker to drop the expired attempt's message",
    )

    # A capable worker joins: a call requested while only the old one ran is served at once by
    # it, under the call's own snapshot (start-to-close 20 s; the new worker registers 0.5 s,
    # and the tool takes 1.5 s), and once.
    # Its queue deadline is roomy: on a loaded machine the capable worker may take longer than
    # the first call's 5 s to start, and this half is about how it is served once it runs.
    _app, roomy = make_app(Settings.from_env({**env, "DEX_SCHEDULE_TO_START": "120"}))
    waiting = roomy.client().request_call("s1", "t2", "waiting", NEW_TOOL, {"seconds": 1.5})
    wait_for(
        lambda: WAITING in waiting_note(dex, waiting.key),
        timeout=10,
        what="the note on the second call",
    )
    new = start(env, skew_workers, "new")
    served = wait_finished(dex, waiting.key, timeout=15)
    assert served.status is CallStatus.SUCCEEDED, served
    assert served.attempts == 1 and served.error is None
    assert served.policy.start_to_close == 20.0
    ((attempt, pid, _),) = lines(waiting.key, "start")
    assert attempt == 1 and pid in new.children()
    assert len(lines(waiting.key, "end")) == 1
    assert finished_events(dex, waiting.key) == 1
