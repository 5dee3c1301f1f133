"""Two sweepers at once over the same due items: each transition happens exactly once (docs/ledger.md,
flow step 6; S3.2, S4.1, S7.3).

50 calls are requested with no worker running, with 0.5 s queue deadlines and leases: 30 are left
to expire in the queue, 20 are claimed by a "ghost" worker that never heartbeats, so their leases
lapse. Two sweepers, each with its own Dex (own Redis connections, own SQL engine, as two beat
processes would have), then sweep in lock-step rounds until every call has ended.
"""

from __future__ import annotations

import threading
import uuid
from collections import Counter
from collections.abc import Iterator

import pytest
import redis

from devtools.pg_schema import postgres_schema
from devtools.processes import wait_for
from devtools.toolapp import make_app
from dex_celery import DID_NOT_RUN, CallStatus, Dex, Settings
from dex_celery.engine.request.dispatch import CallRequest
from dex_celery.engine.upkeep.sweep import Sweeper, SweepReport
from dex_celery.model.ids import parse_task_id
from tests.support.faults.crash import broker_task_ids, events, tool_messages

pytestmark = pytest.mark.crash

FAST = {"DEX_SCHEDULE_TO_START": "0.5", "DEX_HEARTBEAT_TIMEOUT": "0.5"}
READ, WRITE = "slow_read", "slow_non_idempotent_write"
#: (tool, claimed by the ghost, how many calls)
GROUPS = [(READ, False, 20), (WRITE, False, 10), (READ, True, 10), (WRITE, True, 10)]


@pytest.fixture(params=["sqlite", "postgres"])
def database_url(request: pytest.FixtureRequest, env: dict[str, str]) -> Iterator[str]:
    if request.param == "sqlite":
        yield env["DEX_DATABASE_URL"]
    else:
        with postgres_schema() as url:
            yield url


def _dex(env: dict[str, str], database_url: str) -> Dex:
    _app, dex = make_app(Settings.from_env({**env, **FAST, "DEX_DATABASE_URL": database_url}))
    return dex


def test_two_sweepers_move_each_due_item_once(
    dex: Dex, env: dict[str, str], database_url: str
) -> None:
    """Every call ends once: one terminal record, one TOOL message (S4.1, S4.4), one
    `tool_call_finished` event (S7.3); every retry was published once; the moves the two
    sweepers report add up to exactly the transitions that exist."""
    requester = _dex(env, database_url)
    requester.store.create_schema()
    requests = []
    expected: dict[str, tuple[str, bool]] = {}
    for group, (tool, _ghost, count) in enumerate(GROUPS):
        for i in range(count):
            requests.append(CallRequest("s1", f"t{group}", f"c{i}", tool, {"seconds": 0}))
    records = requester.dispatcher.request(requests)
    for record, request in zip(records, requests, strict=True):
        group = int(request.turn_id[1:])
        expected[record.key] = (GROUPS[group][0], GROUPS[group][1])
    for key, (tool, ghost) in expected.items():
        if ghost:
            fence = uuid.uuid4().hex
            claim = requester.ledger.claim(key, 1, owner="ghost:1", fence=fence)
            assert claim.ok, claim
            if tool == WRITE:
                # As a real worker does before any tool code of a write (the write fence):
                # without this claim in SQL the write provably did not run (docs/ledger.md).
                now = requester.ledger.now()
                assert requester.store.claim_write(key, 1, fence=fence, owner="ghost:1", now=now)
    keys = requester.keys
    wait_for(
        lambda: (
            len(requester.ledger.due(keys.queue_index))
            + len(requester.ledger.due(keys.lease_index))
            == len(expected)
        ),
        timeout=10,
        what="every queue deadline and lease to pass",
    )

    sweepers = [_dex(env, database_url).sweeper for _ in range(2)]
    reports: list[SweepReport] = []
    reports_lock = threading.Lock()
    barrier = threading.Barrier(len(sweepers))
    stop = threading.Event()
    failures: list[BaseException] = []

    def loop(sweeper: Sweeper) -> None:
        try:
            while not stop.is_set():
                barrier.wait(timeout=30)
                report = sweeper.sweep_once()
                with reports_lock:
                    reports.append(report)
                stop.wait(0.02)  # pacing between rounds, not synchronisation
        except threading.BrokenBarrierError:
            pass
        except BaseException as e:
            failures.append(e)
            barrier.abort()

    threads = [threading.Thread(target=loop, args=(s,), daemon=True) for s in sweepers]
    for thread in threads:
        thread.start()
    try:
        wait_for(
            lambda: (
                failures
                or all(r.finished for r in requester.store.list_calls(session_id="s1", limit=1000))
            ),
            timeout=60,
            what="every call to end",
        )
    finally:
        stop.set()
        barrier.abort()
        for thread in threads:
            thread.join(timeout=30)
    assert not failures, failures

    # The outcome of each group (S4.2, S4.3).
    final = {r.key: r for r in requester.store.list_calls(session_id="s1", limit=1000)}
    assert set(final) == set(expected)
    for key, (tool, ghost) in expected.items():
        record = final[key]
        if tool == READ:
            assert record.status is CallStatus.FAILED, record
            assert record.attempts == 3, record
            assert (record.error or "").startswith(DID_NOT_RUN) is (not ghost), record.error
        elif ghost:
            assert record.status is CallStatus.OUTCOME_UNKNOWN, record
            assert record.attempts == 1
        else:
            assert record.status is CallStatus.FAILED, record
            assert (record.error or "").startswith(DID_NOT_RUN), record.error
            assert record.attempts == 1

    # One TOOL message and one finished event per call.
    finished = Counter(e["key"] for e in events(requester, type_="tool_call_finished"))
    for key in expected:
        assert len(tool_messages(requester, key)) == 1, key
        assert finished[key] == 1, key

    # Every attempt was published exactly once, and the ledger logged each attempt once.
    published = Counter(broker_task_ids(redis.Redis.from_url(env["DEX_REDIS_URL"])))
    assert max(published.values()) == 1, [t for t, n in published.items() if n > 1]
    by_key: dict[str, list[int]] = {}
    for task_id in published:
        call, attempt = parse_task_id(task_id)
        by_key.setdefault(call.key, []).append(attempt)
    for key, record in final.items():
        assert sorted(by_key[key]) == list(range(1, record.attempts + 1)), key
        entry = requester.ledger.read(key)
        assert entry is not None
        assert [e.attempt for e in entry.log] == list(range(1, record.attempts + 1)), key

    # The two sweepers together made each move once: 20 lapsed leases; 30 calls x attempts in
    # the queue (20 reads x 3 + 10 writes x 1) plus attempts 2 and 3 of the 10 lapsed reads.
    total = Counter[str]()
    for report in reports:
        total.update(report.as_dict())
    assert total["lost"] == 20
    assert total["expired"] == 20 * 3 + 10 + 10 * 2
    assert total["errors"] == 0
    assert len(reports) >= 4  # several rounds, both sweepers in each
