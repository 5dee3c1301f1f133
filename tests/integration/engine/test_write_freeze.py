"""The write freeze (docs/semantics.md, S13.2) with real prefork workers, a real redis-server,
SQLite and the `dex-celery` command itself.

What each test checks is what S13.2 demands: once `writes freeze` has returned no write is
claimed (judged from the tool's own side-effect log and from the records), reads keep running,
a write already running finishes, a write delivered before the freeze but not yet claimed does
not start, `--reject` ends writes `rejected` with a text the model can act on, a freeze survives
the ledger's Redis losing it, and a thaw lets the held calls run in request order.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from devtools.processes import Worker, wait_for
from devtools.toolapp import executions, log_dir, prerun_marker
from dex_celery import CallStatus, Dex, MessageRole
from dex_celery.client.dex_client import DexClient
from dex_celery.engine.attempt.pause_points import PausePoint
from dex_celery.model.event_types import EventType
from dex_celery.model.ids import CallKey
from dex_celery.ops.timeline import EntryKind, session_timeline
from tests.support.faults.pauses import Pauses, pauses_in
from tests.support.processes.cli_run import APP, one_error_line, run

WRITE = "slow_non_idempotent_write"
READ = "slow_read"


def freeze(env: dict[str, str], *args: str) -> str:
    result = run("-A", APP, "writes", "freeze", *args, env=env)
    assert result.returncode == 0, result.stderr
    return result.stdout


def thaw(env: dict[str, str], *args: str) -> str:
    result = run("-A", APP, "writes", "thaw", "--by", "bob", *args, env=env)
    assert result.returncode == 0, result.stderr
    return result.stdout


def status_of(dex: Dex, key: str) -> CallStatus:
    record = dex.store.get_call(key)
    assert record is not None, key
    return record.status


def wait_status(dex: Dex, key: str, status: CallStatus, timeout: float = 30) -> None:
    try:
        wait_for(lambda: status_of(dex, key) is status, timeout=timeout, what=f"{key} {status}")
    except AssertionError:
        raise AssertionError(_debug(dex, key)) from None


def ran(key: str) -> bool:
    """The tool's own side-effect log says it started this call."""
    return any(line.startswith("start ") for line in executions(key))


class Requesters:
    """Three threads, each an agent loop: per turn it requests a write and a read, and waits for
    the read (as a model waits for what it reads), so the load follows what the workers take."""

    def __init__(self, client: DexClient, rounds: int = 10_000) -> None:
        self.client = client
        self.stop = threading.Event()
        self.writes: list[str] = []
        self.reads: list[str] = []
        self._lock = threading.Lock()
        self.threads = [
            threading.Thread(target=self._loop, args=(n, rounds), daemon=True) for n in range(3)
        ]

    def _loop(self, n: int, rounds: int) -> None:
        for i in range(rounds):
            if self.stop.is_set():
                return
            write = self.client.request_call(f"load{n}", f"t{i}", "w", WRITE, {"seconds": 0.05})
            read = self.client.request_call(f"load{n}", f"t{i}", "r", READ, {"seconds": 0.05})
            with self._lock:
                self.writes.append(write.key)
                self.reads.append(read.key)
            self.client.wait([read.key], timeout=60)

    def __enter__(self) -> Requesters:
        for t in self.threads:
            t.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        for t in self.threads:
            t.join(timeout=30)

    def counts(self) -> tuple[int, int]:
        with self._lock:
            return len(self.writes), len(self.reads)


@pytest.fixture
def env(env: dict[str, str]) -> dict[str, str]:
    """The shared test timings, with a queue deadline long enough for the calls a thaw
    releases at once to wait for one worker process (they are claimed one by one, in order)."""
    return {**env, "DEX_SCHEDULE_TO_START": "120"}


@pytest.fixture
def workers(start_worker: Callable[..., Worker]) -> Iterator[list[Worker]]:
    yield [start_worker(concurrency=2), start_worker(concurrency=2)]


def test_freeze_under_load_stops_every_write_claim_and_thaw_resumes_in_order(
    dex: Dex,
    env: dict[str, str],
    workers: list[Worker],
    start_worker: Callable[..., Worker],
    sweeper: threading.Event,
) -> None:
    client = dex.client()
    running = client.request_call("long", "t1", "c1", WRITE, {"seconds": 4}).key
    wait_for(lambda: ran(running), timeout=30, what="the long write to start")

    with Requesters(client) as load:
        wait_for(lambda: load.counts()[0] >= 15, timeout=60, what="writes under load")
        out = freeze(env, "--reason", "incident 42: refunds misfire", "--by", "ann")
        frozen_at = dex.ledger.now()
        assert "frozen by ann" in out and "incident 42" in out
        # What ran or was claimed before the command returned, from the tool's log and SQL.
        before = {k for k in list(load.writes) if ran(k)}
        wait_for(lambda: load.counts()[0] >= len(before) + 30, timeout=60, what="more writes")
        reads_then = load.counts()[1]
        wait_for(lambda: load.counts()[1] >= reads_then + 30, timeout=60, what="reads go on")
    writes, reads = list(load.writes), list(load.reads)

    # Reads keep running: every read requested ends `succeeded`, during the freeze too.
    for key in reads:
        wait_status(dex, key, CallStatus.SUCCEEDED)
    # The write already running finished.
    wait_status(dex, running, CallStatus.SUCCEEDED)
    assert [line.split()[0] for line in executions(running)] == ["start", "end"]

    # No write claimed after the freeze returned: every write the tool ran was claimed (SQL's
    # write fence) before that instant, and every other write waits, held, its tool never run.
    def settled() -> bool:
        return all(status_of(dex, k) is not CallStatus.PENDING for k in writes)

    wait_for(settled, timeout=60, what="every write to run or be held")
    held: list[str] = []
    for key in writes:
        record = dex.store.get_call(key)
        assert record is not None
        if ran(key):
            assert record.claimed_at is not None and record.claimed_at <= frozen_at, key
            assert record.status is CallStatus.SUCCEEDED, key
        else:
            assert record.status is CallStatus.AWAITING_APPROVAL, (key, record.status)
            assert record.claimed_at is None
            held.append(key)
    assert before <= set(writes) - set(held)
    assert len(held) >= 30, len(held)
    pending = {p.key: p for p in dex.approvals.pending(limit=1000)}
    assert set(held) <= set(pending)
    frozen_reason = pending[held[0]].frozen or ""
    assert (
        "frozen" in frozen_reason and "by ann" in frozen_reason and "incident 42" in frozen_reason
    )

    # Thaw with one worker of one process: the held calls are claimed in request order.
    for worker in workers:
        worker.stop()
    start_worker(concurrency=1)
    out = thaw(env)
    assert f"released {len(held)} held call(s)" in out, out
    for key in held:
        wait_status(dex, key, CallStatus.SUCCEEDED, timeout=120)
    records = [dex.store.get_call(k) for k in held]
    by_request = sorted(records, key=lambda r: (r.requested_at, r.key) if r else (0, ""))
    by_claim = sorted(records, key=lambda r: (r.claimed_at or 0) if r else 0)
    assert [r.key for r in by_claim if r] == [r.key for r in by_request if r]
    assert all(len([x for x in executions(k) if x.startswith("start")]) == 1 for k in held)


def test_a_write_delivered_before_the_freeze_but_not_claimed_does_not_start(
    dex: Dex, env: dict[str, str], start_worker: Callable[..., Worker]
) -> None:
    """The freeze is enforced where the write is claimed (S13.2): a message a worker holds
    already, not yet claimed, meets it."""
    start_worker(concurrency=1, extra_env={"DEX_TEST_BLOCK_BEFORE_CLAIM": "1"})
    client = dex.client()
    key = client.request_call("s1", "t1", "c1", WRITE, {"seconds": 0.1}).key
    marker = prerun_marker(CallKey.parse(key).task_id(1))
    wait_for(marker.exists, timeout=30, what="the worker to hold the delivery, unclaimed")
    freeze(env, "--reason", "stop", "--by", "ann")
    (log_dir() / "release-prerun").touch()
    wait_status(dex, key, CallStatus.AWAITING_APPROVAL)
    assert not ran(key)
    assert any(e.get("type") == EventType.TOOL_CALL_FROZEN for e in _events(dex, key))
    # A person may still let it through during the freeze: their decision is later than it.
    dex.approvals.approve(key, "carol", "checked by hand")
    wait_status(dex, key, CallStatus.SUCCEEDED)
    assert ran(key)


def test_a_reject_freeze_of_one_tool_rejects_its_writes_only(
    dex: Dex, env: dict[str, str], start_worker: Callable[..., Worker]
) -> None:
    start_worker(concurrency=2)
    freeze(env, "--reason", "card processor down", "--tool", WRITE, "--reject", "--by", "ann")
    client = dex.client()
    write = client.request_call("s1", "t1", "c1", WRITE, {"seconds": 0.01}).key
    other = client.request_call("s1", "t1", "c2", "slow_idempotent_write", {"seconds": 0.01}).key
    read = client.request_call("s1", "t1", "c3", READ, {"seconds": 0.01}).key
    wait_status(dex, write, CallStatus.REJECTED)
    wait_status(dex, other, CallStatus.SUCCEEDED)
    wait_status(dex, read, CallStatus.SUCCEEDED)
    assert not ran(write)
    record = dex.store.get_call(write)
    assert record is not None and record.error is not None
    assert "the tool did not run" in record.error and "card processor down" in record.error
    assert "Do not retry this write while writes are frozen" in record.error
    tool_output = [
        m.tool_output or ""
        for m in client.get_agent_snapshot("s1").messages
        if m.role is MessageRole.TOOL and m.tool_call_id == "c1"
    ]
    assert tool_output and "card processor down" in tool_output[0]
    out = thaw(env, "--tool", WRITE)
    assert "thawed: writes of tool slow_non_idempotent_write" in out
    again = client.request_call("s1", "t2", "c1", WRITE, {"seconds": 0.01}).key
    wait_status(dex, again, CallStatus.SUCCEEDED)


def test_the_freeze_survives_redis_losing_it(
    dex: Dex, env: dict[str, str], start_worker: Callable[..., Worker]
) -> None:
    """SQL is the record; the ledger's copy comes back at the next sweep, and before any new
    life of the ledger (a Redis that lost its data)."""
    freeze(env, "--reason", "hold everything", "--by", "ann")
    for shard in dex.keys.all_shards:
        dex.ledger.client.delete(shard.freeze)
    report = dex.sweeper.sweep_once()
    assert report.errors == 0
    assert all(seen for seen in dex.ledger.read_freezes())

    dex.ledger.client.flushdb()  # Redis replaced by an empty one: a new life of the ledger
    dex.runtime.epoch.current(refresh=True)
    assert all(seen for seen in dex.ledger.read_freezes())
    start_worker(concurrency=1)
    key = dex.client().request_call("s1", "t1", "c1", WRITE, {"seconds": 0.01}).key
    wait_status(dex, key, CallStatus.AWAITING_APPROVAL)
    assert not ran(key)
    out = thaw(env)
    assert "released 1 held call(s)" in out
    wait_status(dex, key, CallStatus.SUCCEEDED)
    kinds = [e.kind for e in session_timeline(dex, "s1").entries if e.call_key == key]
    assert kinds.index(EntryKind.HELD_BY_FREEZE) < kinds.index(EntryKind.RELEASED_BY_THAW)


@pytest.fixture
def pauses(tmp_path: Path) -> Pauses:
    return pauses_in(tmp_path)


HOLD = PausePoint.BEFORE_HOLD
BEFORE_HOLD = "the worker to stand between the refused claim and the hold"


def test_a_thaw_between_a_refused_claim_and_its_hold_reports_no_hold_and_the_call_runs(
    dex: Dex, env: dict[str, str], start_worker: Callable[..., Worker], pauses: Pauses
) -> None:
    """The thaw ends the freeze after the claim met it and before the worker held the call: the
    thaw held nothing of it, so it reports no call released, and the worker opens the call again
    itself; it runs once, never held (docs/guardrails.md, "A thaw racing a hold")."""
    start_worker(concurrency=1, extra_env=pauses.env(HOLD))
    freeze(env, "--reason", "incident 7", "--by", "ann")
    key = dex.client().request_call("s1", "t1", "c1", WRITE, {"seconds": 0.01}).key
    pauses.wait(HOLD, BEFORE_HOLD)
    out = thaw(env)
    assert "released 0 held call(s)" in out, out
    pauses.release(HOLD)
    wait_status(dex, key, CallStatus.SUCCEEDED)
    assert [line.split()[0] for line in executions(key)] == ["start", "end"]
    assert dex.runtime.freeze.freezes.holds_of([key]) == []


def test_a_worker_killed_before_its_hold_leaves_the_call_to_meet_the_freeze_again(
    dex: Dex,
    env: dict[str, str],
    start_worker: Callable[..., Worker],
    sweeper: threading.Event,
    pauses: Pauses,
) -> None:
    """SIGKILL between the refused claim (the call's ledger entry gone) and the hold: the call
    is `pending` with no entry; the sweeper opens it again, its next claim meets the freeze and
    it is held, its tool never run; the thaw names it and it runs once (docs/ledger.md, "Crash
    table")."""
    worker = start_worker(concurrency=1, extra_env=pauses.env(HOLD))
    freeze(env, "--reason", "incident 8", "--by", "ann")
    key = dex.client().request_call("s1", "t1", "c1", WRITE, {"seconds": 0.01}).key
    pauses.wait(HOLD, BEFORE_HOLD)
    worker.kill_all()
    assert status_of(dex, key) is CallStatus.PENDING
    start_worker(concurrency=1)
    wait_status(dex, key, CallStatus.AWAITING_APPROVAL, timeout=60)
    assert not ran(key)
    out = thaw(env)
    assert "released 1 held call(s)" in out, out
    wait_status(dex, key, CallStatus.SUCCEEDED)
    assert [line.split()[0] for line in executions(key)] == ["start", "end"]


def test_a_thaw_cut_off_after_its_record_is_finished_by_the_next_thaw(
    dex: Dex, env: dict[str, str], start_worker: Callable[..., Worker]
) -> None:
    """The state a `writes thaw` killed right after recording the thaw leaves: the freeze ended
    in SQL, the ledger's copy still frozen, the held call still waiting. The next `writes thaw`
    tells the ledger, releases the call and names it (docs/guardrails.md)."""
    start_worker(concurrency=1)
    freeze(env, "--reason", "incident 9", "--by", "ann")
    key = dex.client().request_call("s1", "t1", "c1", WRITE, {"seconds": 0.01}).key
    wait_status(dex, key, CallStatus.AWAITING_APPROVAL)
    dex.runtime.freeze.freezes.end(None, "bob", dex.ledger.now())  # the thaw's record, alone
    assert status_of(dex, key) is CallStatus.AWAITING_APPROVAL
    out = thaw(env)
    assert "writes were not frozen" in out and "released 1 held call(s)" in out, out
    wait_status(dex, key, CallStatus.SUCCEEDED)
    assert [line.split()[0] for line in executions(key)] == ["start", "end"]
    assert all(not seen for seen in dex.ledger.read_freezes())


def test_cli_bad_input_is_one_error_line_and_writes_nothing(dex: Dex, env: dict[str, str]) -> None:
    for args in (
        ["--reason", "   ", "--by", "ann"],
        ["--reason", "x", "--tool", "no_such_tool", "--by", "ann"],
        ["--reason", "bad\x07bell", "--by", "ann"],
    ):
        line = one_error_line(run("-A", APP, "writes", "freeze", *args, env=env))
        assert "freeze" in line or "tool" in line or "reason" in line, line
    assert dex.writes.history() == []
    status = run("-A", APP, "writes", "status", env=env)
    assert status.returncode == 0 and "writes are not frozen" in status.stdout


def _events(dex: Dex, key: str) -> list[dict[str, str]]:
    entries = dex.ledger.client.xrange(dex.keys.events)
    return [fields for _id, fields in entries if fields.get("key") == key]  # type: ignore[union-attr]


def _debug(dex: Dex, key: str) -> str:
    return f"{dex.store.get_call(key)} {dex.ledger.read(key)} {executions(key)} {_events(dex, key)}"
