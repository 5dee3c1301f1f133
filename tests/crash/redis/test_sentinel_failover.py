"""Redis Sentinel failover (S10.2): the primary SIGKILLed mid-run, Sentinel promotes a replica,
calls keep being served, and every outcome is honest against the tools' own logs.

Real processes: a primary and two replicas (`appendonly yes`, `appendfsync always`), one
`redis-sentinel` (told to fail over once the primary is dead, so that a loaded machine's slow
answers never trigger a second failover), a prefork worker (restarted if it dies, as a supervisor would), the sweeper
and the requester, all connected through Sentinel (`DEX_REDIS_URL=sentinel://...`; the broker
through Kombu's `sentinel://`).

The replicas are made to LAG before the primary dies: they are stopped (SIGSTOP) and the
primary drops their links (`CLIENT KILL TYPE replica`), so every write after that point is on
the primary only, as with asynchronous replication that fell behind, and is lost when a replica
is promoted. The honesty checks, for every call:

- a call whose tool ran (the tool's own log) is never recorded "the tool did not run";
- a `non_idempotent_write` ran at most once;
- calls requested after the failover succeed, each tool running once.

Three variants:

1. `claim_replicas=1`, the attempts' messages delivered before the replicas fall behind and
   their claims made after: no replica acknowledges the claims, so no tool runs on them, and
   the failover loses no claim of a tool that ran. Passes with the durable-claim option alone.
2. `claim_replicas=1`, the messages also delivered after the replicas fall behind: the
   promoted broker gives back messages the dead primary had handed out, and a write whose
   record is already final may be claimed again in the promoted ledger. Needs the SQL claim
   fence for writes (the rest of issue 9).
3. No option: the claims of running tools are lost with the primary. Needs rollback detection
   (the rest of issue 9).
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import ClassVar

import pytest
import redis

from devtools.processes import RedisServer, Worker, wait_for
from devtools.toolapp import BLOCK_BEFORE_CLAIM_ENV, LOG_ENV, prerun_marker
from dex_celery import DID_NOT_RUN, CallStatus, Dex, ToolCallRecord
from dex_celery.model.ids import CallKey
from tests.support.faults.crash import lines, release_tools, wait_finished, wait_started
from tests.support.faults.sentinel import MASTER_NAME, ReplicatedRedis

pytestmark = pytest.mark.crash

#: Longer than the failover (about 4 s here), so healthy leases survive it.
# A queue deadline well beyond the time a failover and a new ledger life take on a loaded
# machine: a call made after the failover must not expire while the ledger settles.
TIMINGS = {"DEX_HEARTBEAT_TIMEOUT": "10", "DEX_SCHEDULE_TO_START": "30"}
#: Kombu's Redis transport keeps each delivered, unacknowledged message in this hash.
KOMBU_UNACKED = "unacked"


@pytest.fixture
def group(tmp_path: Path) -> Iterator[ReplicatedRedis]:
    replicated = ReplicatedRedis(tmp_path / "redis", replicas=2).start()
    yield replicated
    replicated.stop()


@pytest.fixture
def failover(dex: Dex, env: dict[str, str], group: ReplicatedRedis, sweeper: object) -> Failover:
    """One failover run of the test's deployment, with the sweeper running."""
    return Failover(dex, env, group)


@pytest.fixture
def env(
    env: dict[str, str], group: ReplicatedRedis, request: pytest.FixtureRequest
) -> dict[str, str]:
    """The deployment through Sentinel; each variant's class says whether a claim waits for a
    replica (`durable`) and what else it sets (`extra_env`)."""
    assert group.sentinel is not None
    return {
        **env,
        **TIMINGS,
        "DEX_REDIS_URL": group.sentinel.url,
        "DEX_REDIS_SENTINEL_MASTER": MASTER_NAME,
        "DEX_CLAIM_REPLICAS": "1" if request.cls.durable else "0",
        "DEX_CLAIM_REPLICAS_TIMEOUT": "0.5",
        **getattr(request.cls, "extra_env", {}),
    }


class Supervisor:
    """Keeps one worker running, as compose's `restart: unless-stopped` does.

    Celery 5.7 / Kombu 5.7 may end a worker with "Unrecoverable error: AttributeError(... no
    attribute 'hostname')" when its broker connection drops while late-acknowledged messages
    are in flight (Kombu's restore of unacknowledged messages on close); the deployment's
    supervisor starts it again. Its running tools die with it: their calls end as for a lost
    worker (S4.3), which the honesty checks cover.
    """

    def __init__(
        self, start_worker: Callable[..., Worker], extra_env: dict[str, str] | None = None
    ) -> None:
        self.start = lambda: start_worker(concurrency=2, extra_env=extra_env)
        self.worker = self.start()
        self.restarts = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, daemon=True)
        self._thread.start()

    def _watch(self) -> None:
        while not self._stop.wait(0.2):
            if self.worker.died():
                self.restarts += 1
                self.worker = self.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=60)


class Failover:
    """One run: requests through Sentinel, replicas made to lag, the primary killed."""

    def __init__(self, dex: Dex, env: dict[str, str], group: ReplicatedRedis) -> None:
        assert group.primary is not None and group.sentinel is not None
        self.dex, self.env, self.group = dex, env, group
        self.primary: RedisServer = group.primary
        self.client = dex.client()
        self.keys: list[str] = []

    def request(self, turn: str, call: str, tool: str, **arguments: object) -> str:
        self.keys.append(self.client.request_call("s1", turn, call, tool, arguments).key)
        return self.keys[-1]

    def writes_queued_behind_busy_slots(
        self, start_worker: Callable[..., Worker]
    ) -> tuple[Supervisor, list[str]]:
        """The workers started, both slots of the supervised one busy with reads, two writes
        queued behind them, then the replicas fall behind: where variants 2 and 3 start."""
        supervisor = Supervisor(start_worker)
        for i in range(2):
            wait_started(self.request("t1", f"busy{i}", "slow_read", seconds=3))
        queued = [
            self.request("t2", f"w{i}", "slow_non_idempotent_write", seconds=60) for i in (0, 1)
        ]
        self.replicas_fall_behind()
        return supervisor, queued

    def replicas_fall_behind(self) -> None:
        ReplicatedRedis.wait_replicated(self.primary, len(self.group.followers))
        for follower in self.group.followers:
            self.group.pause(follower)
        redis.Redis(port=self.primary.port).client_kill_filter(_type="replica")

    def kill_primary(self) -> None:
        """Kill the primary; return once a replica is promoted and the ledger has noticed.

        "After the failover" is after the sweeper started the ledger's new life (its epoch
        changed, docs/ledger.md "Rollback detection"): a read requested and run in the moments
        before that may be run once more when the old life's entry is judged from SQL, which
        the rules allow for reads; the calls of `serve_after` must each run exactly once.
        """
        old, sentinel = self.primary.port, self.group.sentinel
        assert sentinel is not None
        epoch_before = self._epoch()
        self.primary.kill()
        for follower in self.group.followers:
            self.group.resume(follower)

        def promoted() -> bool:
            now = sentinel.master_port_now()
            if now == old:
                sentinel.fail_over()  # refused while one is under way: never a second one
            return now not in (None, old) and self._answers()

        wait_for(
            promoted, timeout=60, what="Sentinel to promote a replica and the ledger to reach it"
        )
        wait_for(
            lambda: self._epoch() not in (None, epoch_before),
            timeout=30,
            what="the sweeper to start a new ledger epoch on the promoted replica",
        )
        # Sentinel points the other replica at the promoted one: claims can count again.
        promoted = self.group.server_on(sentinel.master_port_now() or 0)
        ReplicatedRedis.wait_replicated(promoted, len(self.group.followers) - 1)

    def _epoch(self) -> str | None:
        try:
            value = self.dex.ledger.client.get(self.dex.ledger.keys.epoch)
        except redis.RedisError:
            return None
        return None if value is None else str(value)

    def _answers(self) -> bool:
        try:
            return bool(self.dex.ledger.client.ping())
        except redis.RedisError:
            return False

    def serve_after(self) -> list[str]:
        return [
            self.request("t9", "echo", "echo"),
            self.request("t9", "idem", "slow_idempotent_write", seconds=0),
            self.request("t9", "write", "slow_non_idempotent_write", seconds=0),
        ]

    def finish(self, supervisor: Supervisor) -> dict[str, ToolCallRecord]:
        release_tools(self.env)
        try:
            return {key: wait_finished(self.dex, key, timeout=60) for key in self.keys}
        finally:
            supervisor.stop()

    def kill_primary_then_finish(self, supervisor: Supervisor) -> dict[str, ToolCallRecord]:
        """Every variant's end: the primary dies, calls requested after it are served, every
        call ends, and each record is honest about what ran (`_assert_honest`)."""
        self.kill_primary()
        after = self.serve_after()
        records = self.finish(supervisor)
        _assert_honest(records, after)
        return records


def _assert_honest(records: dict[str, ToolCallRecord], after: list[str]) -> None:
    for key, record in records.items():
        started = [a for a, _, _ in lines(key, "start")]
        if started:
            assert not (record.error or "").startswith(DID_NOT_RUN), (key, record.error, started)
        if record.effect.value in ("non_idempotent_write", "unclassified"):
            assert len(started) <= 1, (key, started)
    for key in after:
        assert records[key].status is CallStatus.SUCCEEDED, (key, records[key].error)
        assert len(lines(key, "start")) == 1, key


class TestWithDurableClaims:
    durable = True

    def test_claims_made_while_replicas_lag_never_run_a_tool(
        self, failover: Failover, start_worker: Callable[..., Worker]
    ) -> None:
        """Variant 1: the failover loses no claim of a tool that ran."""
        supervisor = Supervisor(start_worker, {BLOCK_BEFORE_CLAIM_ENV: "1"})
        # Both writes delivered and held before their claims, with every replica in sync.
        # Held for a minute if they ran: without the option they would be running when the
        # primary dies, their claims lost with it.
        writes = [
            failover.request("t1", f"w{i}", "slow_non_idempotent_write", seconds=60) for i in (0, 1)
        ]
        task_ids = [CallKey.parse(key).task_id(1) for key in writes]
        wait_for(
            lambda: all(prerun_marker(t).exists() for t in task_ids),
            timeout=30,
            what="both writes delivered and held before their claims",
        )
        # Every tool task is acknowledged late (docs/ledger.md, "Celery options"): the writes'
        # messages stay unacknowledged until they end; their claims, not the broker, fence them.
        failover.replicas_fall_behind()
        (Path(failover.env[LOG_ENV]) / "release-prerun").write_text("go")
        refused = [wait_finished(failover.dex, key, timeout=30) for key in writes]
        # In flight when the primary dies: requested while the replicas lag.
        failover.request("t2", "echo", "echo")
        failover.request("t2", "write", "slow_non_idempotent_write", seconds=0)
        records = failover.kill_primary_then_finish(supervisor)
        for key, record in zip(writes, refused, strict=True):
            assert lines(key, "start") == [], key
            assert record.status is CallStatus.FAILED
            assert (record.error or "").startswith(DID_NOT_RUN)
            assert "0 of the 1 Redis replica(s)" in (record.error or "")
            assert records[key] == record  # the promoted ledger changed nothing


class TestWithDurableClaimsBrokerRollback:
    durable = True
    # A long queue deadline: the messages given back are still claimable after the failover.
    extra_env: ClassVar[dict[str, str]] = {"DEX_SCHEDULE_TO_START": "60"}

    def test_messages_handed_out_while_replicas_lag_never_run_a_write_again(
        self, failover: Failover, start_worker: Callable[..., Worker]
    ) -> None:
        """Variant 2: the promoted broker gives back messages the dead primary had handed out."""
        supervisor, queued = failover.writes_queued_behind_busy_slots(start_worker)
        for key in queued:
            # Refused (no replica holds the claim), or, on a machine too loaded to claim in time,
            # expired in the queue: either ends without running the tool (checked below). The
            # wait covers the 60 s queue deadline of this variant.
            wait_finished(failover.dex, key, timeout=90)
        failover.kill_primary_then_finish(supervisor)


class TestWithoutDurableClaims:
    durable = False

    def test_claims_lost_with_the_primary_leave_honest_records(
        self, failover: Failover, start_worker: Callable[..., Worker]
    ) -> None:
        """Variant 3: writes claimed and running on the primary alone when it dies."""
        supervisor, queued = failover.writes_queued_behind_busy_slots(start_worker)
        for key in queued:
            wait_started(key, timeout=30)  # claimed on the primary only
        failover.kill_primary_then_finish(supervisor)
        for key in queued:
            assert [a for a, _, _ in lines(key, "start")] == [1], key
