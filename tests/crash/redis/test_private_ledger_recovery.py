"""A write killed in one `dex-celery dev` run stays `outcome_unknown` in the next (S10.2, S10.3).

The first run's whole stack is SIGKILLed (dev, its private Redis, its prefork worker and beat,
at once: a power cut) while a `non_idempotent_write` runs. Its claim is committed in SQL (the
write fence, docs/ledger.md), its private Redis is gone. The second `dev` on the same SQLite
file starts a private Redis of its own; the database, bound to the first run's private Redis,
starts a new ledger life instead of refusing, and judges the call in flight from SQL: it holds
a claim, so the call ends `outcome_unknown` and the tool's own side-effect log shows it ran
exactly once.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

from devtools.toolapp import LOG_ENV, make_app
from dex_celery import CallStatus, Settings
from dex_celery.store.bindings import LedgerOrigin, read_binding
from tests.support.faults.crash import lines, wait_finished, wait_started
from tests.support.processes.dev_stack import (
    alive,
    kill_everything,
    stack_environment,
    start_dev,
    started_processes,
    stop_dev,
    wait_dev_ready,
)

pytestmark = pytest.mark.crash

APP = "devtools.toolapp"


@pytest.fixture
def leftovers(tmp_path: Path) -> Iterator[None]:
    """After the test, end whatever a failed assertion left running of either run."""
    yield
    for out in tmp_path.glob("dev-*.out"):
        for pid in started_processes(out.read_text()).values():
            if alive(pid):
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(pid, signal.SIGKILL)


def test_a_write_killed_in_the_first_run_stays_unknown_after_the_second_runs_new_ledger(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, leftovers: None
) -> None:
    env = stack_environment(tmp_path)
    # The tool's side-effect log, written by the stack's worker and read here.
    env[LOG_ENV] = str(tmp_path / "tool-log")
    monkeypatch.setenv(LOG_ENV, env[LOG_ENV])
    first_out, second_out = tmp_path / "dev-1.out", tmp_path / "dev-2.out"

    first = start_dev(APP, env, first_out)
    try:
        first_redis = wait_dev_ready(first, first_out)
        _app, dex = make_app(Settings.from_env({**env, "DEX_REDIS_URL": first_redis}))
        client = dex.client()
        write = client.request_call("s1", "t1", "c1", "slow_non_idempotent_write", {"seconds": 120})
        wait_started(write.key)
        claimed = dex.store.get_call(write.key)
        assert claimed is not None and claimed.status is CallStatus.PENDING
        dex.ledger.client.close()
    finally:
        kill_everything(first, first_out)
    redis_dir = Path(first_out.read_text().split("(private, in ", 1)[1].split(";", 1)[0])
    shutil.rmtree(redis_dir.parent, ignore_errors=True)
    with pytest.raises(redis.ConnectionError):
        redis.Redis.from_url(first_redis, socket_connect_timeout=1).ping()
    # Nothing of the first run recorded an end: the call is still pending in SQL.
    assert dex.store.get_call(write.key).status is CallStatus.PENDING  # type: ignore[union-attr]

    second = start_dev(APP, env, second_out)
    try:
        second_redis = wait_dev_ready(second, second_out)
        _app, again = make_app(Settings.from_env({**env, "DEX_REDIS_URL": second_redis}))
        done = wait_finished(again, write.key, timeout=60)
        assert done.status is CallStatus.OUTCOME_UNKNOWN, done
        # A read through the new ledger runs: the second run serves calls.
        read = again.client().request_call("s2", "t1", "c1", "slow_read", {"seconds": 0})
        served = wait_finished(again, read.key, timeout=60)
        assert served.status is CallStatus.SUCCEEDED, served
        binding = read_binding(again.store.engine)
        assert binding is not None and binding.origin is LedgerOrigin.PRIVATE
        assert second_redis.split("//", 1)[1].split("/", 1)[0] in binding.location
        again.ledger.client.close()
    finally:
        stop_dev(second, second_out)
    # Never run again: the tool's own log has the first run's start and nothing more.
    assert len(lines(write.key, "start")) == 1, lines(write.key, "start")
    assert lines(write.key, "end") == []
    output = second_out.read_text()
    assert "LedgerMismatch" not in output and "sweep failed" not in output, output[-3000:]
