"""Deploys under load (docs/reliability.md, "Deploys"): warm rolling restarts surface nothing; a
SIGTERM followed by a SIGKILL after the grace costs only the writes whose tools were running.

Real processes: several requester processes (`tests/support/processes/load_requester.py`) keep a steady
load of calls of all four effect classes (tools of 0.1-3 s) while two workers are restarted the
way systemd, `docker stop` and Kubernetes do it (SIGTERM to the main process, a new worker once
it has exited). Checked from SQL, the events stream and the tools' own log.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from devtools.processes import ROOT, Worker, wait_for
from dex_celery import OUTCOME_UNKNOWN_TOOL_RESULT, CallStatus, Dex, EffectClass
from dex_celery.model.records import ToolCallRecord
from tests.support.faults import crash

POOLS = pytest.mark.parametrize("pool", ["prefork", "threads"])
#: Requester processes, and calls each requests (one every `load_requester.PACE` seconds).
REQUESTERS, CALLS_EACH = 3, 40
#: The deadline a call may wait in the queue: the deployment default, not the crash tests' 5 s,
#: since under this load a call may queue behind others for a while while a worker restarts.
LOAD_ENV = {"DEX_SCHEDULE_TO_START": "60"}
WRITES = (EffectClass.NON_IDEMPOTENT_WRITE, EffectClass.UNCLASSIFIED)


def warm_restart(worker: Worker, start: Callable[[], Worker]) -> tuple[Worker, int]:
    """SIGTERM to the main process, start its successor meanwhile (a rolling update with one
    worker of surge), then wait for the old one to exit on its own; its exit status."""
    assert worker.process is not None
    os.kill(worker.pid, signal.SIGTERM)
    successor = start()
    code = worker.process.wait(timeout=30)
    worker.process = None
    return successor, code


@POOLS
def test_three_rolling_warm_restarts_under_load_surface_nothing(
    dex: Dex,
    env: dict[str, str],
    start_worker: Callable[..., Worker],
    sweeper: threading.Event,
    tmp_path: Path,
    pool: str,
) -> None:
    def start() -> Worker:
        return start_worker(concurrency=2, pool=pool, extra_env=LOAD_ENV)

    workers = [start(), start()]
    keys_file = tmp_path / "keys"
    requester_env = {**os.environ, **env, **LOAD_ENV}
    requesters = [
        subprocess.Popen(
            [
                *(sys.executable, "-m", "tests.support.processes.load_requester"),
                *(f"load{i}", str(CALLS_EACH), str(1000 + i), str(keys_file)),
            ],
            cwd=ROOT,
            env=requester_env,
        )
        for i in range(REQUESTERS)
    ]
    codes = []
    try:
        wait_for(
            lambda: keys_file.exists() and len(keys_file.read_text().split()) >= 10,
            timeout=30,
            what="the load to start",
        )
        for _round in range(3):
            for i in range(len(workers)):
                workers[i], code = warm_restart(workers[i], start)
                codes.append(code)
        for requester in requesters:
            assert requester.wait(timeout=120) == 0
    finally:
        for requester in requesters:
            requester.kill()
    assert codes == [0] * 6  # each warm shutdown ended on its own, after its running tools

    keys = keys_file.read_text().split()
    assert len(keys) == REQUESTERS * CALLS_EACH
    records = [crash.wait_finished(dex, key, timeout=90) for key in keys]
    not_clean = [r for r in records if r.status is not CallStatus.SUCCEEDED or r.attempts != 1]
    assert not not_clean, [(r.key, r.status, r.attempts, r.error) for r in not_clean]
    for record in records:
        starts = crash.lines(record.key, "start")
        if record.effect in WRITES:
            assert len(starts) == 1, (record.key, starts)
        assert len(crash.lines(record.key, "end")) >= 1
        assert crash.finished_events(dex, record.key) == 1
        (message,) = crash.tool_messages(dex, record.key)
        assert record.result is not None and record.result.strip('"') in message


@pytest.mark.parametrize(
    ("pool", "killer"),
    [
        ("prefork", "supervisor"),
        ("threads", "supervisor"),
        ("prefork", "worker"),
        ("threads", "second-sigterm"),
    ],
)
def test_sigterm_then_sigkill_after_the_grace_costs_only_the_running_writes(
    dex: Dex,
    env: dict[str, str],
    start_worker: Callable[..., Worker],
    sweeper: threading.Event,
    pool: str,
    killer: str,
) -> None:
    """A 5 s grace, tools of 15 s. `supervisor`: the test sends SIGKILL 5 s after SIGTERM, as
    Kubernetes does after `terminationGracePeriodSeconds`; `worker`: `DEX_SHUTDOWN_GRACE=5` and
    the worker ends itself; `second-sigterm`: a second SIGTERM ends it at once. Each way: the writes whose tools ran on the stopped worker end
    `outcome_unknown` (S4.3), its read and idempotent write are retried to success, and calls
    that waited in the queue, or ran on the other worker, succeed with one attempt."""
    grace = 5.0
    own_grace = {"DEX_SHUTDOWN_GRACE": str(grace)} if killer == "worker" else {}
    stopped = start_worker(concurrency=4, pool=pool, extra_env=own_grace)
    client = dex.client()
    running: dict[EffectClass, ToolCallRecord] = {}
    for effect in EffectClass:
        running[effect] = client.request_call(
            "s1", "t1", effect.value, f"slow_{effect.value}", {"seconds": 15}
        )
    for record in running.values():
        assert crash.runs_in(stopped, crash.wait_started(record.key))
    other = start_worker(concurrency=2, pool=pool)
    elsewhere = client.request_call("s1", "t2", "busy", "slow_read", {"seconds": 15})
    assert crash.runs_in(other, crash.wait_started(elsewhere.key))

    assert stopped.process is not None
    os.kill(stopped.pid, signal.SIGTERM)
    sent = time.monotonic()
    # During the grace: the stopping worker takes nothing new; this call waits for `other`.
    queued = client.request_call("s1", "t3", "queued", "slow_non_idempotent_write", {"seconds": 0})
    if killer == "supervisor":
        time.sleep(max(0.0, sent + grace - time.monotonic()))  # the supervisor's grace period
        assert stopped.process.poll() is None  # its tools still ran: 15 s > 5 s
        stopped.kill_all()
    elif killer == "worker":
        assert stopped.process.wait(timeout=grace + 10) == 70  # ended itself at its grace
        assert time.monotonic() - sent >= grace - 0.5
        assert "the shutdown grace of 5.0 s is over with 4 attempt(s) still running" in (
            stopped.log()
        )
        stopped.stop()  # nothing is left of it; reaps the process
    else:
        wait_for(
            lambda: "worker: Warm shutdown" in stopped.log(),
            timeout=10,
            what="the warm shutdown to begin",
        )
        os.kill(stopped.pid, signal.SIGTERM)
        assert stopped.process.wait(timeout=10) == 70
        assert "a second SIGTERM with 4 attempt(s) still running" in stopped.log()
        stopped.stop()
    crash.release_tools(env)  # the other worker's tools, and every retry, now return at once

    for effect, record in running.items():
        done = crash.wait_finished(dex, record.key, timeout=30)
        if effect in WRITES:
            assert done.status is CallStatus.OUTCOME_UNKNOWN, done
            (message,) = crash.tool_messages(dex, record.key)
            assert OUTCOME_UNKNOWN_TOOL_RESULT in message
            assert [a for a, _, _ in crash.lines(record.key, "start")] == [1]
        else:
            assert done.status is CallStatus.SUCCEEDED, done
            assert done.attempts == 2, done
            (first, retried) = crash.lines(record.key, "start")
            assert (first[0], retried[0]) == (1, 2) and crash.runs_in(other, retried[1])
    for record in (elsewhere, queued):
        done = crash.wait_finished(dex, record.key, timeout=30)
        assert done.status is CallStatus.SUCCEEDED, done
        assert done.attempts == 1 and len(crash.lines(record.key, "start")) == 1
