"""One database, one ledger, when the bound ledger is gone (docs/ledger.md; S10.2, S10.3).

A database bound to a private Redis that `dex-celery dev` or `demo` started (the Redis carries
`private_redis.MARK_KEY`, the binding records `LedgerOrigin.PRIVATE`) and that no longer
answers is bound by the next process to the ledger of its own, empty Redis; the calls in flight
are judged from SQL as after a rollback. Every other case keeps refusing, with a message that
says how to recover: the private Redis still answers, it was another host's, the bound Redis
was a configured one (`dex-celery db rebind-ledger --yes`, tested here through the CLI), or the
process's Redis holds another database's ledger. The sweeper loop says a refusal once.
"""

from __future__ import annotations

import logging
import os
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import redis
from sqlalchemy import update

from devtools.processes import ROOT, RedisServer, wait_for
from devtools.toolapp import make_app
from dex_celery import CallStatus, Dex, Settings
from dex_celery.engine.upkeep.sweep import run_forever
from dex_celery.errors import LedgerMismatch
from dex_celery.ledger import private_redis
from dex_celery.store.bindings import (
    Binding,
    LedgerOrigin,
    bind,
    read_binding,
    rebind,
    release_binding,
)
from dex_celery.store.schema import ledger_bindings
from tests.support.faults.crash import wait_finished

CLI = str(Path(sys.executable).parent / "dex-celery")
APP = "devtools.toolapp:dex"


@pytest.fixture
def servers(tmp_path: Path) -> Iterator[Callable[..., RedisServer]]:
    """Start redis-servers of the test's own (`private=True`: marked as `dev` marks its own)."""
    started: list[RedisServer] = []

    def start(name: str, *, private: bool, port: int | None = None) -> RedisServer:
        extra = {} if port is None else {"port": port}
        # Durable, so the CLI's start-up check has nothing to warn about: its one line is the
        # refusal.
        server = RedisServer(
            tmp_path / name, appendonly=True, appendfsync="always", **extra
        ).start()
        started.append(server)
        if private:
            client = redis.Redis.from_url(server.url)
            private_redis.mark(client)
            client.close()
        return server

    yield start
    for server in started:
        server.kill()


def _dex_on(env: dict[str, str], server: RedisServer) -> Dex:
    _app, dex = make_app(Settings.from_env({**env, "DEX_REDIS_URL": server.url}))
    return dex


def _bind_first(dex: Dex) -> str:
    """Any process's first look binds the database to its ledger."""
    dex.runtime.epoch.current()
    binding = read_binding(dex.store.engine)
    assert binding is not None
    return binding.ledger_id


def _claimed_then_gone(
    env: dict[str, str], servers: Callable[..., RedisServer]
) -> tuple[str, Binding | None]:
    """A write claimed on the deployment's (configured) Redis "first", which then dies: the
    write's key and the database's binding to that Redis's ledger."""
    first = servers("first", private=False)
    before = _dex_on(env, first)
    write = before.client().request_call(
        "s1", "t1", "c1", "slow_non_idempotent_write", {"seconds": 0}
    )
    assert before.store.claim_write(
        write.key, 1, fence="f1", owner="celery@gone:7", now=before.ledger.now()
    )
    old = read_binding(before.store.engine)
    before.ledger.client.close()
    first.kill()
    return write.key, old


def _cli(env: dict[str, str], server: RedisServer, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [CLI, "-A", APP, *args],
        cwd=ROOT,
        env={**os.environ, **env, "DEX_REDIS_URL": server.url},
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_a_gone_private_ledger_is_replaced_and_calls_in_flight_are_judged_from_sql(
    dex: Dex, env: dict[str, str], servers: Callable[..., RedisServer]
) -> None:
    first = servers("first", private=True)
    before = _dex_on(env, first)
    client = before.client()
    claimed = client.request_call("s1", "t1", "c1", "slow_non_idempotent_write", {"seconds": 0})
    unclaimed = client.request_call("s1", "t1", "c2", "slow_non_idempotent_write", {"seconds": 1})
    read = client.request_call("s1", "t1", "c3", "slow_read", {"seconds": 0})
    # A worker committed the first write's claim (the write fence), then the stack was gone.
    assert before.store.claim_write(
        claimed.key, 1, fence="f1", owner="celery@gone:7", now=before.ledger.now()
    )
    old = read_binding(before.store.engine)
    assert old is not None and old.origin is LedgerOrigin.PRIVATE
    assert old.origin_host == private_redis.this_host()
    before.ledger.client.close()
    first.kill()

    second = servers("second", private=True)
    after = _dex_on(env, second)

    def judged() -> bool:
        after.sweeper.sweep_once()
        record = after.store.get_call(claimed.key)
        return record is not None and record.finished

    wait_for(judged, timeout=30, what="the claimed write to be judged in the new ledger")
    assert after.store.get_call(claimed.key).status is CallStatus.OUTCOME_UNKNOWN  # type: ignore[union-attr]
    # Never claimed: no tool code can have run; opened afresh in the new ledger, as a read is.
    for record in (unclaimed, read):
        entry = after.ledger.read(record.key)
        assert entry is not None and entry.state == "enqueued", (record.key, entry)
        assert after.store.get_call(record.key).status is CallStatus.PENDING  # type: ignore[union-attr]
    now = read_binding(after.store.engine)
    assert now is not None and now.ledger_id != old.ledger_id
    assert now.location == after.runtime.epoch.location
    assert now.origin is LedgerOrigin.PRIVATE
    assert after.ledger.client.get(after.ledger.keys.ledger_id) == now.ledger_id


def test_a_gone_private_ledger_whose_port_another_redis_took_is_replaced(
    dex: Dex, env: dict[str, str], servers: Callable[..., RedisServer]
) -> None:
    first = servers("first", private=True)
    old = _bind_first(_dex_on(env, first))
    first.kill()
    servers("squatter", private=False, port=first.port)  # answers, but holds no ledger
    second = servers("second", private=True)
    assert _bind_first(_dex_on(env, second)) != old


def test_a_private_ledger_that_still_answers_is_not_replaced(
    dex: Dex, env: dict[str, str], servers: Callable[..., RedisServer]
) -> None:
    """Two `dev` stacks at once on one database: the second refuses while the first runs."""
    first = servers("first", private=True)
    old = _bind_first(_dex_on(env, first))
    second = _dex_on(env, servers("second", private=True))
    with pytest.raises(LedgerMismatch, match="still runs on this host: stop it first"):
        second.sweeper.sweep_once()
    assert read_binding(dex.store.engine).ledger_id == old  # type: ignore[union-attr]


def test_a_private_ledger_of_another_host_is_not_replaced(
    dex: Dex, env: dict[str, str], servers: Callable[..., RedisServer]
) -> None:
    """Its loopback address says nothing here: it may still run there."""
    first = servers("first", private=True)
    old = _bind_first(_dex_on(env, first))
    with dex.store.engine.begin() as conn:
        conn.execute(update(ledger_bindings).values(origin_host="another-host"))
    first.kill()
    second = _dex_on(env, servers("second", private=True))
    with pytest.raises(LedgerMismatch, match="db rebind-ledger --release --yes"):
        second.sweeper.sweep_once()
    assert read_binding(dex.store.engine).ledger_id == old  # type: ignore[union-attr]


def test_a_redis_holding_another_databases_ledger_is_refused_even_by_the_rebind_command(
    dex: Dex, env: dict[str, str], servers: Callable[..., RedisServer], tmp_path: Path
) -> None:
    first = servers("first", private=True)
    old = _bind_first(_dex_on(env, first))
    first.kill()
    other_db = {**env, "DEX_DATABASE_URL": f"sqlite:///{tmp_path / 'other.db'}"}
    shared = servers("shared", private=True)
    other = _dex_on(other_db, shared)
    other.store.create_schema()
    _bind_first(other)  # the Redis now holds the other database's ledger
    with pytest.raises(LedgerMismatch, match="holds another database's ledger"):
        _dex_on(env, shared).sweeper.sweep_once()
    refused = _cli(env, shared, "db", "rebind-ledger", "--yes")
    assert refused.returncode == 1, refused
    assert refused.stderr.startswith("error: ") and len(refused.stderr.splitlines()) == 1
    assert "another database's ledger" in refused.stderr
    assert read_binding(dex.store.engine).ledger_id == old  # type: ignore[union-attr]


def test_a_configured_ledger_keeps_refusing_until_the_operator_rebinds(
    dex: Dex,
    env: dict[str, str],
    servers: Callable[..., RedisServer],
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The refusal names the command; the command without --yes changes nothing; with it the
    database is bound to the app's Redis and the claimed write is judged from SQL."""
    key, old = _claimed_then_gone(env, servers)
    assert old is not None and old.origin is LedgerOrigin.CONFIGURED
    second = servers("second", private=False)  # the deployment's Redis now
    after = _dex_on(env, second)

    # The sweeper loop (beat's, `sweep --loop`'s) says it once, with the way out.
    sweeps = 0
    sweep_once = after.sweeper.sweep_once

    def counted() -> object:
        nonlocal sweeps
        sweeps += 1
        return sweep_once()

    after.sweeper.sweep_once = counted  # type: ignore[method-assign]
    stop = threading.Event()
    loop = threading.Thread(
        target=run_forever, args=(after.sweeper,), kwargs={"stop": stop, "interval": 0.05}
    )
    with caplog.at_level(logging.INFO, logger="dex_celery"):
        loop.start()
        try:
            wait_for(lambda: sweeps >= 6, timeout=30, what="six refused sweeps")
            refusals = [r for r in caplog.records if "cannot sweep" in r.getMessage()]
            assert len(refusals) == 1, [r.getMessage() for r in caplog.records]
            assert refusals[0].levelno == logging.ERROR
            assert "db rebind-ledger --yes" in refusals[0].getMessage()
            assert not any("sweep failed" in r.getMessage() for r in caplog.records)

            # The CLI: one error line naming the app, exit 1.
            refused = _cli(env, second, "sweep")
            assert refused.returncode == 1, refused
            assert refused.stderr.startswith("error: ") and len(refused.stderr.splitlines()) == 1
            assert f"`dex-celery -A {APP} db rebind-ledger --yes`" in refused.stderr
            assert "Traceback" not in refused.stderr
            unconfirmed = _cli(env, second, "db", "rebind-ledger")
            assert unconfirmed.returncode == 1, unconfirmed
            assert unconfirmed.stderr.startswith("error: nothing was changed: rerun with --yes")
            assert len(unconfirmed.stderr.splitlines()) == 1
            assert read_binding(dex.store.engine) == old

            rebound = _cli(env, second, "db", "rebind-ledger", "--yes")
            assert rebound.returncode == 0, rebound
            now = read_binding(dex.store.engine)
            assert now is not None and now.ledger_id != old.ledger_id
            assert now.location == after.runtime.epoch.location
            assert now.origin is LedgerOrigin.CONFIGURED
            assert f"bound to the ledger at {now.location}" in rebound.stdout

            wait_for(
                lambda: any("sweeps again" in r.getMessage() for r in caplog.records),
                timeout=30,
                what="the sweeper loop to sweep the rebound ledger",
            )
            done = wait_finished(after, key, timeout=30)
            assert done.status is CallStatus.OUTCOME_UNKNOWN, done
        finally:
            stop.set()
            loop.join(timeout=15)
    again = _cli(env, second, "db", "rebind-ledger", "--yes")
    assert again.returncode == 0 and "nothing to rebind" in again.stdout, again
    assert read_binding(dex.store.engine) == now


def test_two_rebinds_of_one_gone_ledger_bind_it_once(dex: Dex) -> None:
    """Compare-and-set: of processes that notice the same gone ledger, one rebinds."""
    engine = dex.store.engine
    bind(engine, "old", "127.0.0.1:1/0 p", time.time(), origin=LedgerOrigin.PRIVATE)
    won = rebind(
        engine, expected="old", ledger_id="a", location="L-a", now=1.0, origin=LedgerOrigin.PRIVATE
    )
    lost = rebind(
        engine, expected="old", ledger_id="b", location="L-b", now=2.0, origin=LedgerOrigin.PRIVATE
    )
    assert won == lost and won.ledger_id == "a" and won.location == "L-a"


def test_a_dev_stack_on_a_configured_ledgers_database_is_told_to_release_it(
    dex: Dex, env: dict[str, str], servers: Callable[..., RedisServer]
) -> None:
    """A `dev` or `demo` stack's Redis lives only while it runs: the way out is to release the
    database (SQL only, no Redis needed), and the stack's next look binds it to its ledger."""
    key, old = _claimed_then_gone(env, servers)
    stack = _dex_on(env, servers("stack", private=True))
    with pytest.raises(LedgerMismatch, match="db rebind-ledger --release --yes`, naming the app"):
        stack.sweeper.sweep_once()

    gone = servers("gone", private=False)
    gone.kill()  # the CLI needs no Redis for a release: its settings may name none that answers
    unconfirmed = _cli(env, gone, "db", "rebind-ledger", "--release")
    assert unconfirmed.returncode == 1, unconfirmed
    assert unconfirmed.stderr.startswith("error: nothing was changed: rerun with --yes")
    assert len(unconfirmed.stderr.splitlines()) == 1
    assert read_binding(dex.store.engine) == old
    released = _cli(env, gone, "db", "rebind-ledger", "--release", "--yes")
    assert released.returncode == 0, released
    assert "released" in released.stdout
    assert read_binding(dex.store.engine) is None

    def judged() -> bool:
        stack.sweeper.sweep_once()
        record = stack.store.get_call(key)
        return record is not None and record.finished

    wait_for(judged, timeout=30, what="the claimed write to be judged in the stack's ledger")
    assert stack.store.get_call(key).status is CallStatus.OUTCOME_UNKNOWN  # type: ignore[union-attr]
    now = read_binding(dex.store.engine)
    assert now is not None and now.origin is LedgerOrigin.PRIVATE
    again = _cli(env, gone, "db", "rebind-ledger", "--release")
    assert again.returncode == 1  # bound again, so there is something to release: asks first


def test_a_rebind_of_a_binding_released_meanwhile_binds_afresh(dex: Dex) -> None:
    engine = dex.store.engine
    bind(engine, "old", "127.0.0.1:1/0 p", time.time(), origin=LedgerOrigin.PRIVATE)
    assert release_binding(engine, expected="old")
    assert not release_binding(engine, expected="old")  # compare-and-set: once
    now = rebind(
        engine, expected="old", ledger_id="a", location="L-a", now=1.0, origin=LedgerOrigin.PRIVATE
    )
    assert now.ledger_id == "a" and read_binding(engine) == now
