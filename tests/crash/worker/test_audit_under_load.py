"""The audit log of a busy deployment verifies (S13.4.2, S13.4.3, docs/audit.md).

Two prefork workers, a threads worker and four concurrent requesters run 1,000 calls of three
effect classes; one prefork worker is SIGKILLed midway (its pool processes and recorder with
it), so attempts die, outcomes are left to the sweeper and writes end `outcome_unknown`. Once
every call has its record, `audit verify` finds nothing: every chain whole, every record
agreeing with the chain's last word on it. On SQLite and on the running PostgreSQL.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable

import pytest
from sqlalchemy import func, select

from devtools.processes import Worker, wait_for
from devtools.toolapp import VISIBILITY_TIMEOUT_ENV
from dex_celery import CallStatus, Dex
from dex_celery.audit.keys import Signer
from dex_celery.audit.verify import verify_database
from dex_celery.engine.request.dispatch import CallRequest
from dex_celery.errors import RequestInFlight
from dex_celery.store.schema import audit_log, tool_calls
from tests.support.stores.databases import ON_BOTH_DATABASES

pytestmark = [pytest.mark.crash, ON_BOTH_DATABASES]

SIGNER = Signer.generate()
CALLS = 1000
REQUESTERS = 4
#: Calls per request (one turn).
TURN = 10
#: The killed worker's unacknowledged messages come back within seconds (docs/redis.md).
SHORT_VISIBILITY = {VISIBILITY_TIMEOUT_ENV: "2"}
TOOLS = ("slow_read", "slow_idempotent_write", "slow_non_idempotent_write")


@pytest.fixture
def env(env: dict[str, str]) -> dict[str, str]:
    """Every process of the deployment signs with the same key."""
    return {**env, "DEX_AUDIT_KEY": SIGNER.private_text()}


def open_calls(dex: Dex) -> int:
    with dex.store.engine.connect() as conn:
        query = select(func.count()).where(
            tool_calls.c.status.in_([CallStatus.PENDING.value, CallStatus.AWAITING_APPROVAL.value])
        )
        return int(conn.execute(query).scalar_one())


@pytest.mark.timeout(600)
def test_the_log_of_a_load_with_a_worker_killed_verifies(
    dex: Dex, start_worker: Callable[..., Worker], sweeper: threading.Event
) -> None:
    killed = start_worker(concurrency=2, extra_env=SHORT_VISIBILITY)
    start_worker(concurrency=2, extra_env=SHORT_VISIBILITY)
    start_worker(concurrency=4, pool="threads", extra_env=SHORT_VISIBILITY)
    client = dex.client()
    requested = [0]
    lock = threading.Lock()
    errors: list[BaseException] = []

    def requester(n: int) -> None:
        try:
            for turn in range(CALLS // REQUESTERS // TURN):
                request(
                    [
                        CallRequest(
                            f"load{n}",
                            f"t{turn}",
                            f"c{i}",
                            TOOLS[(turn + i) % len(TOOLS)],
                            {"seconds": 0.01, "value": i},
                        )
                        for i in range(TURN)
                    ]
                )
                with lock:
                    requested[0] += TURN
        except BaseException as e:
            errors.append(e)

    def request(calls: list[CallRequest]) -> None:
        """A request whose calls are recorded but not started (the ledger's answer lost, e.g.
        by the killed worker's restore racing it) is one the sweeper starts: still requested."""
        with contextlib.suppress(RequestInFlight):
            client.request_calls(calls)

    threads = [threading.Thread(target=requester, args=(n,)) for n in range(REQUESTERS)]
    for t in threads:
        t.start()
    wait_for(lambda: requested[0] >= CALLS // 2, timeout=120, what="half the calls requested")
    killed.kill_all()  # midway: its pool processes' attempts and its recorder's batch with it
    for t in threads:
        t.join(timeout=300)
    assert not errors, errors[0]
    assert requested[0] == CALLS
    started = time.monotonic()
    wait_for(lambda: open_calls(dex) == 0, timeout=240, what="every call recorded")
    print(f"every call recorded {time.monotonic() - started:.1f}s after the last request")

    findings = verify_database(dex.store, SIGNER.verifier())
    assert findings.ok, findings.lines()
    with dex.store.engine.connect() as conn:
        outcomes = conn.execute(
            select(func.count()).where(audit_log.c.kind == "outcome")
        ).scalar_one()
        writers = conn.execute(select(func.count(func.distinct(audit_log.c.writer)))).scalar_one()
    assert outcomes == CALLS, "one outcome entry per call"
    assert writers >= REQUESTERS + 3, "requesters, recorders and the sweeper each have a chain"
    assert findings.entries >= 3 * CALLS
