"""S10.1, one clock: worker, sweeper and requester hosts whose wall clocks disagree by a minute
change no outcome.

Each role runs in its own process with a clock shim (`tests/support/faults/clock_skew/`) that moves
`time.time`, `time.time_ns` and `datetime.now` by `DEX_TEST_CLOCK_SKEW` seconds: a Celery prefork
worker, `dex-celery sweep --loop`, and a requester that asks for the calls through the client.
The same five calls run once with every clock right and then with each role 30 s ahead in one
run and 30 s behind in the other (worker and sweeper a full minute apart). Were any lease,
deadline or backoff taken from a host clock, some outcome would move: a worker behind the sweeper
has its healthy lease lapse at once (a false `lost`, the read run twice), a requester behind
makes every claim `expired`, one ahead lets the unserved call wait 30 s past its deadline. Each
run is checked against the tools' own side-effect log, and every time the database recorded is
checked to be Redis's (the test host's true clock), not a skewed host's.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from devtools.processes import ROOT, Worker, wait_for
from devtools.toolapp import executions
from dex_celery import Dex
from dex_celery.ledger.attempt_log import parse_attempt_log
from dex_celery.model.outcomes import DID_NOT_RUN
from dex_celery.model.records import ToolCallRecord
from tests.support.faults.skew import SweeperProcess, request_in_child, skewed

pytestmark = pytest.mark.crash

SKEW = 30.0


@dataclass(frozen=True)
class Clocks:
    """Seconds each role's wall clock is ahead of the true time (negative: behind)."""

    worker: float
    sweeper: float
    requester: float


RUNS = {
    "unskewed": Clocks(0.0, 0.0, 0.0),
    "worker and requester ahead, sweeper behind": Clocks(SKEW, -SKEW, SKEW),
    "worker and requester behind, sweeper ahead": Clocks(-SKEW, SKEW, -SKEW),
}

#: name -> (tool, arguments). `devtools/toolapp.py` holds the tools.
CALLS: dict[str, tuple[str, dict[str, Any]]] = {
    "read": ("host_clock", {}),
    "read retried after a retryable error": ("flaky_read_backoff", {"fail_times": 1}),
    "non_idempotent_write": ("slow_non_idempotent_write", {"seconds": 0.3}),
    "slow read, heartbeat timeout 2 s": ("slow_short_heartbeat", {"seconds": 4.0}),
    "expires in the queue": ("unserved_write", {}),
}


@dataclass(frozen=True)
class Seen:
    """What one call ended as, in SQL and in its tool's own log."""

    status: str
    attempts: int
    executions: int
    did_not_run: bool
    error: str


#: The unskewed run must end this way, so that "identical to it" cannot hold vacuously.
EXPECTED = {
    "read": ("succeeded", 1, 1, False),
    "read retried after a retryable error": ("succeeded", 2, 2, False),
    "non_idempotent_write": ("succeeded", 1, 1, False),
    "slow read, heartbeat timeout 2 s": ("succeeded", 1, 1, False),
    "expires in the queue": ("failed", 1, 0, True),
}


def test_the_shim_moves_a_child_clock(env: dict[str, str]) -> None:
    """The shim is in force in a child started with it (else the test below proves nothing)."""
    probe = (
        "import time, datetime; "
        "print(time.time(), time.time_ns() / 1e9, datetime.datetime.now().timestamp(), "
        "datetime.datetime.now(datetime.timezone.utc).timestamp())"
    )
    for seconds in (SKEW, -SKEW):
        before = time.time()
        out = subprocess.run(
            [sys.executable, "-c", probe],
            cwd=ROOT,
            env=skewed(env, seconds),
            capture_output=True,
            text=True,
            check=True,
        ).stdout.split()
        after = time.time()
        for reading in map(float, out):
            assert before + seconds - 1 <= reading <= after + seconds + 1, (seconds, out)


def test_skewed_clocks_change_no_outcome(
    dex: Dex, env: dict[str, str], start_worker: Callable[..., Worker], tmp_path: Path
) -> None:
    runs = {
        label: one_run(dex, env, start_worker, tmp_path, f"skew{index}", clocks)
        for index, (label, clocks) in enumerate(RUNS.items())
    }

    baseline = runs["unskewed"].seen
    got = {
        name: (s.status, s.attempts, s.executions, s.did_not_run) for name, s in baseline.items()
    }
    assert got == EXPECTED, baseline
    for label, run in runs.items():
        assert run.seen == baseline, f"{label}: {run.seen} differs from the unskewed run {baseline}"
    for label, run in runs.items():
        clocks = RUNS[label]
        # The shim was in force: the requester and the worker saw their clocks off as told.
        assert abs(run.requester_offset - clocks.requester) < 5, (label, run.requester_offset)
        host = json.loads(run.records["read"].result or "{}")
        for reading in (host["time"], host["datetime"]):
            assert run.started + clocks.worker - 1 <= reading <= run.ended + clocks.worker + 1, (
                label,
                host,
            )
        for record in run.records.values():
            _check_times_are_redis_time(record, run.started - 1, run.ended + 1)


@dataclass(frozen=True)
class Run:
    seen: dict[str, Seen]
    records: dict[str, ToolCallRecord]
    #: The requester's wall clock minus the true time, as it reported it.
    requester_offset: float
    #: The run's bounds on the true clock (this process's, unskewed; Redis runs on this host).
    started: float
    ended: float


def one_run(
    dex: Dex,
    env: dict[str, str],
    start_worker: Callable[..., Worker],
    tmp_path: Path,
    session: str,
    clocks: Clocks,
) -> Run:
    """Start the three skewed roles, request the calls, wait for every one to end."""
    started = time.time()
    sweeper_log = tmp_path / f"{session}-sweeper.log"
    sweeper = SweeperProcess(skewed(env, clocks.sweeper), sweeper_log).start()
    worker = start_worker(concurrency=3, extra_env=skewed(env, clocks.worker))
    try:
        calls = [
            (session, f"t{i}", f"c{i}", tool, arguments)
            for i, (tool, arguments) in enumerate(CALLS.values())
        ]
        requested = request_in_child(skewed(env, clocks.requester), calls)
        offset = requested.host_time - time.time()
        keys = dict(zip(CALLS, requested.keys, strict=True))
        try:
            wait_for(
                lambda: all(_record(dex, k).finished for k in keys.values()),
                timeout=40,
                what=f"every call of {session} to end (clocks {clocks})",
                interval=0.2,
            )
        except AssertionError as e:
            states = {name: _record(dex, key).status.value for name, key in keys.items()}
            raise AssertionError(f"{e}; statuses {states}") from None
        assert sweeper.alive(), sweeper_log.read_text()[-3000:]
        assert not worker.died(), worker.log()[-3000:]
    finally:
        sweeper.stop()
        worker.stop()
    records = {name: _record(dex, key) for name, key in keys.items()}
    seen = {
        name: Seen(
            status=record.status.value,
            attempts=record.attempts,
            executions=sum(1 for line in executions(record.key) if line.startswith("start ")),
            did_not_run=(record.error or "").startswith(DID_NOT_RUN),
            error=record.error or "",
        )
        for name, record in records.items()
    }
    return Run(seen, records, offset, started, time.time())


def _record(dex: Dex, key: str) -> ToolCallRecord:
    record = dex.store.get_call(key)
    assert record is not None, key
    return record


def _check_times_are_redis_time(record: ToolCallRecord, low: float, high: float) -> None:
    """Every time stored for the call is Redis's: inside the run on the true clock, whichever
    host (requester, worker, sweeper) wrote it."""
    times = {"requested_at": record.requested_at, "finished_at": record.finished_at}
    if record.claimed_at is not None:
        times["claimed_at (write fence)"] = record.claimed_at
    for entry in parse_attempt_log(record.attempt_log):
        times[f"attempt {entry.attempt} ended_at"] = entry.ended_at
        if entry.claimed_at is not None:
            times[f"attempt {entry.attempt} claimed_at"] = entry.claimed_at
    for name, value in times.items():
        assert value is not None and low <= value <= high, (
            f"{record.key}: {name} = {value} is not Redis's time (run {low:.0f}..{high:.0f})"
        )
