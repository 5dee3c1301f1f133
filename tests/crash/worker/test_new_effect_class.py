"""An effect class added to the table alone (`dex_celery/model/effects.py`) is honoured
everywhere, end to end with a real prefork worker (`tests/support/apps/effect_class_app.py`).

`once_then_failed` is fenced, runs once, and a lost attempt ends `failed` (no class of S1.2
does that); `retried_unfenced` is retried and keeps a Redis-only claim. The requester resolves
the policy, the worker decides the write fence, the ledger's scripts decide retries and what a
lost attempt becomes (from the flags open.lua writes), the dispatcher records it: each from the
class's row.
"""

from __future__ import annotations

import os
import signal
from collections.abc import Iterator
from pathlib import Path

import pytest

from devtools.processes import CeleryWorker
from devtools.toolapp import LOG_ENV
from dex_celery import CallStatus, Dex, Settings
from dex_celery.model.effects import EffectClass
from tests.support.apps.effect_class_app import (
    ONCE,
    RETRIED,
    make_app,
    register_classes,
    unregister_classes,
)
from tests.support.faults.crash import lines, wait_finished, wait_started

pytestmark = pytest.mark.crash


@pytest.fixture
def classes() -> Iterator[dict[str, EffectClass]]:
    """The test's classes, in this process for the test's length only."""
    registered = register_classes()
    yield registered
    unregister_classes(registered)


@pytest.fixture
def probe_dex(dex: Dex, env: dict[str, str], classes: dict[str, EffectClass]) -> Dex:
    """The requester of the test's tools (after `dex`, which sets the environment and schema)."""
    return make_app(classes, Settings.from_env(env))[1]


@pytest.fixture
def worker(env: dict[str, str]) -> Iterator[CeleryWorker]:
    started = CeleryWorker(
        "tests.support.apps.effect_class_worker:app", env, Path(env[LOG_ENV]), concurrency=1
    ).start()
    yield started
    started.stop()


def test_a_new_class_is_retried_fenced_and_lost_as_its_row_says(
    probe_dex: Dex, classes: dict[str, EffectClass], worker: CeleryWorker
) -> None:
    dex = probe_dex
    client = dex.client()
    once, retried = classes[ONCE], classes[RETRIED]

    # Retryability: the requester's snapshot and the ledger's retry follow the row.
    r = client.request_call("s1", "t1", "r", f"flaky_{RETRIED}", {})
    assert r.policy.effect is retried and r.policy.max_attempts == 3
    o = client.request_call("s1", "t1", "o", f"flaky_{ONCE}", {})
    assert o.policy.effect is once and o.policy.max_attempts == 1
    done = wait_finished(dex, r.key)
    assert (done.status, done.attempts) == (CallStatus.SUCCEEDED, 2), done
    assert done.claimed_by is None  # not fenced: no SQL claim
    failed = wait_finished(dex, o.key)
    assert (failed.status, failed.attempts) == (CallStatus.FAILED, 1), failed
    assert failed.claimed_by is not None  # fenced: claimed in SQL before its code ran
    assert [a for a, _, _ in lines(o.key, "start")] == [1]

    # What a lost attempt becomes: `failed` (a built-in fenced class would be outcome_unknown).
    lost = client.request_call("s1", "t1", "l", f"held_{ONCE}", {})
    os.kill(wait_started(lost.key), signal.SIGKILL)
    record = wait_finished(dex, lost.key)
    assert (record.status, record.attempts) == (CallStatus.FAILED, 1), record
    assert record.claimed_by is not None
    entry = dex.ledger.read(lost.key)
    assert entry is not None and (entry.status, entry.reason) == ("failed", "lost"), entry
