"""A write budget held while its call's outcome is unknown (S13.1.3), with real prefork workers
and a real SIGKILL, on a private redis-server and on a Redis Cluster (the ledger of one shard,
the broker a separate redis-server).

A budget of one write per session: the write is killed mid-run, ends `outcome_unknown`, and its
unit stays held, so the next write of the session waits for a person saying so. Reconciliation
settles it: "went through" spends the unit (the next write still waits), "did not run" releases
it (the next write runs). Two witnesses: the record and the tool's own log. The audit log says
the same (S13.4.1): the charge reserved with the request, held with the unknown outcome, then
spent or released with the verdict; and `audit verify` finds nothing.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable, Iterator

import pytest
from sqlalchemy import select

from devtools.processes import Worker, wait_for
from devtools.redis_cluster import RedisClusterNodes
from dex_celery import CallStatus, Dex, DidNotRun, OutcomeChecks, WentThrough
from dex_celery.audit.keys import Signer
from dex_celery.audit.verify import verify_database
from dex_celery.ops.timeline import EntryKind, session_timeline
from dex_celery.store.schema import audit_log
from tests.support.faults.crash import lines, wait_finished, wait_started

pytestmark = pytest.mark.crash

TOOL = "slow_non_idempotent_write"
BUDGET = f"writes: tools={TOOL} limit=1 label=writes"
#: Every process of the deployment signs its audit entries with the same key.
SIGNER = Signer.generate()


@pytest.fixture(params=["redis-server", "redis-cluster"])
def env(env: dict[str, str], request: pytest.FixtureRequest) -> Iterator[dict[str, str]]:
    out = {
        **env,
        "DEX_BUDGETS": BUDGET,
        "DEX_SCHEDULE_TO_START": "60",
        "DEX_AUDIT_KEY": SIGNER.private_text(),
    }
    if request.param == "redis-cluster":
        cluster = request.getfixturevalue("redis_cluster")
        assert isinstance(cluster, RedisClusterNodes)
        out |= {"DEX_REDIS_URL": cluster.url, "DEX_BROKER_URL": env["DEX_REDIS_URL"]}
    yield out


def _held_after_kill(dex: Dex, worker: Worker, session: str) -> str:
    client = dex.client()
    record = client.request_call(session, "t1", "w1", TOOL, {"seconds": 60})
    assert record.status is CallStatus.PENDING
    wait_started(record.key)
    worker.kill_all()
    assert wait_finished(dex, record.key).status is CallStatus.OUTCOME_UNKNOWN
    # Held: settled by whoever recorded the unknown outcome, right after its SQL write.
    wait_for(lambda: _totals(dex, session) == (0.0, 0.0, 1.0), timeout=30, what="the charge held")
    assert len(lines(record.key, "start")) == 1
    return record.key


def _totals(dex: Dex, session: str) -> tuple[float, float, float] | None:
    return dex.ledger.read_budget(dex.keys.budget("writes", f"session:{session}"), window=0.0)


@pytest.mark.parametrize("went_through", [False, True], ids=["did-not-run", "went-through"])
def test_a_killed_write_holds_its_budget_until_reconciled(
    dex: Dex,
    start_worker: Callable[..., Worker],
    sweeper: threading.Event,
    went_through: bool,
) -> None:
    session = "went" if went_through else "not-run"
    key = _held_after_kill(dex, start_worker(concurrency=1), session)

    waiting = dex.client().request_call(session, "t2", "w2", TOOL, {"seconds": 0.05})
    assert waiting.status is CallStatus.AWAITING_APPROVAL
    assert waiting.budget_reason is not None
    assert waiting.budget_reason.startswith("1 of 1 writes in this session already used or in")

    checks = OutcomeChecks()
    verdict = WentThrough if went_through else DidNotRun
    checks.register(TOOL, lambda k, _args: verdict(f"the order service says: {k}"))
    report = dex.runtime.reconciler.run_once(checks=checks)
    assert report.reported == 1, report
    expected = (0.0, 1.0, 0.0) if went_through else (0.0, 0.0, 0.0)
    assert _totals(dex, session) == expected
    # The session's story says so too (S13.6.5).
    settled = [
        e.summary
        for e in session_timeline(dex, session).entries
        if e.kind is EntryKind.BUDGET_SETTLED and e.call_key == key
    ]
    verdict_text = (
        "spent (reconciled: went_through)"
        if went_through
        else ("released (reconciled: did_not_run)")
    )
    assert settled == ["budget writes: held until reconciled", f"budget writes: {verdict_text}"]

    start_worker(concurrency=1)
    later = dex.client().request_call(session, "t3", "w3", TOOL, {"seconds": 0.05})
    if went_through:  # spent: the session's one write is used
        assert later.status is CallStatus.AWAITING_APPROVAL
        assert not lines(later.key, "start")
    else:  # released: the unit is usable by the next call
        assert later.status is CallStatus.PENDING
        assert wait_finished(dex, later.key).status is CallStatus.SUCCEEDED
        assert len(lines(later.key, "start")) == 1
        # The recorder settles the charge in `recorded.lua` right after it wrote the outcome
        # to SQL (docs/guardrails.md): the SQL status may be read first.
        wait_for(
            lambda: _totals(dex, session) == (0.0, 1.0, 0.0),
            timeout=30,
            what="the next call's charge to be spent",
        )
    # The killed write ran once, by its own log, and never again.
    assert len(lines(key, "start")) == 1
    # The audit log's word on its charge, and the log verifies (S13.4.1, S13.4.3).
    settled = "budget_spent" if went_through else "budget_released"
    assert _budget_entries(dex, key) == [
        ("budget_reserved", None),
        ("budget_held", "outcome_unknown"),
        (settled, "went_through" if went_through else "did_not_run"),
    ]
    findings = verify_database(dex.store, SIGNER.verifier())
    assert findings.ok, findings.lines()


def _budget_entries(dex: Dex, key: str) -> list[tuple[str, str | None]]:
    """The call's budget entries in time order: (kind, the status or verdict that moved it)."""
    query = (
        select(audit_log.c.kind, audit_log.c.body)
        .where(audit_log.c.call_key == key)
        .where(audit_log.c.kind.like("budget_%"))
        .order_by(audit_log.c.at)
    )
    with dex.store.engine.connect() as conn:
        rows = conn.execute(query).all()
    out = []
    for kind, body in rows:
        said = json.loads(body)
        assert (said["budget"], said["scope"], said["charge"], said["limit"]) == (
            "writes",
            f"session:{key.split('/')[0]}",
            1,
            1,
        )
        out.append((kind, said.get("status") or said.get("verdict")))
    return out
