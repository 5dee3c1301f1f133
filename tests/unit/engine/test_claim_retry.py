"""A claim that cannot reach Redis (docs/redis.md, section 2): tried again for
`CLAIM_RETRY_WINDOW`, then its delivery is handed back to the broker, never failed as a task
with the call still queued. The crash test with a real worker and a cut link is
tests/crash/redis/test_heartbeat_blip.py."""

from __future__ import annotations

import socket
from typing import cast

import pytest
import redis
from celery.exceptions import Reject
from redis.backoff import NoBackoff
from redis.retry import Retry

from dex_celery.engine.attempt import worker
from dex_celery.engine.attempt.shutdown_gate import ShutdownGate
from dex_celery.errors import LedgerError
from dex_celery.ledger.keys import KeySpace
from dex_celery.ledger.ledger import Ledger


def _unreachable_ledger() -> Ledger:
    """A ledger whose Redis refuses every connection (a port nothing listens on)."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    client = redis.Redis(port=port, socket_connect_timeout=0.5, retry=Retry(NoBackoff(), 0))
    return Ledger(client, keys=KeySpace("claim-retry"))


def test_a_claim_redis_never_answers_is_handed_back_to_the_broker(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(worker, "CLAIM_RETRY_WINDOW", 0.3)
    with pytest.raises(Reject) as handed:
        worker.claim_attempt(_unreachable_ledger(), "s/t/c", 1, owner="o", fence="f")
    assert handed.value.requeue is True
    assert "Redis could not be reached to claim it" in str(handed.value.reason)


def test_a_shutdown_during_the_retries_ends_them_without_a_claim(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The worker's warm shutdown cuts the retries short: nothing claimed, handed back by the
    caller (`Worker._claim`), as for a shutdown during a backoff."""
    monkeypatch.setattr(worker, "CLAIM_RETRY_WINDOW", 60.0)
    gate = ShutdownGate()
    gate.shut()
    ledger = _unreachable_ledger()
    assert worker.claim_attempt(ledger, "s/t/c", 1, owner="o", fence="f", gate=gate) is None


class _AnsweringWithAnError:
    """A ledger whose Redis answers every claim with an error (a script's fault)."""

    def claim(self, *_args: object, **_kwargs: object) -> None:
        raise LedgerError("ledger script claim failed: ERR something the script did")


def test_an_error_redis_answers_with_fails_the_task_instead_of_handing_it_back(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Handing such a delivery back would send its message round again and again."""
    monkeypatch.setattr(worker, "CLAIM_RETRY_WINDOW", 0.2)
    ledger = cast(Ledger, _AnsweringWithAnError())
    with pytest.raises(LedgerError):
        worker.claim_attempt(ledger, "s/t/c", 1, owner="o", fence="f")
