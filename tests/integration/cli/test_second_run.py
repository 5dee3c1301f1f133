"""`dex-celery demo` and `dex-celery dev` a second (and third) time on one SQLite file.

The first run binds the database to the ledger in its private Redis (docs/ledger.md, "One
database, one ledger"); that Redis is gone when the run ends. The next run starts a private
Redis of its own: the database recovers by itself (a new ledger life, the calls in flight
judged from SQL as after a rollback, S10.2) instead of refusing with `LedgerMismatch`, and beat
sweeps without a failure.
"""

from __future__ import annotations

import re
import shlex
import subprocess
import time
from pathlib import Path

from devtools.processes import wait_for
from dex_celery import CallStatus, Settings
from dex_celery.engine.counters import last_sweep
from dex_celery.store.bindings import LedgerOrigin, bind, read_binding
from dex_celery.store.migrate import upgrade
from dex_celery.store.sql_engine import make_engine
from tests.support.dev_stack import (
    SCRIPT,
    alive,
    stack_environment,
    start_dev,
    started_processes,
    stop_dev,
    wait_dev_ready,
)


def _binding(env: dict[str, str]) -> tuple[str, str, LedgerOrigin]:
    engine = make_engine(env["DEX_DATABASE_URL"])
    try:
        binding = read_binding(engine)
    finally:
        engine.dispose()
    assert binding is not None
    return binding.ledger_id, binding.location, binding.origin


def test_the_demo_runs_three_times_on_one_database(tmp_path: Path) -> None:
    """Each run binds the database to its own private Redis, the one before it being gone: all
    three exit 0 and show every outcome; each run's ledger is a new one."""
    env = stack_environment(tmp_path)
    ledgers = []
    for run in range(3):
        result = subprocess.run(
            [str(SCRIPT), "demo"],
            cwd=tmp_path,
            env=env,
            capture_output=True,
            text=True,
            timeout=150,
        )
        output = result.stdout + result.stderr
        assert result.returncode == 0, f"run {run + 1}:\n{output}"
        assert "LedgerMismatch" not in output
        for outcome in ("succeeded", "failed", "rejected", "outcome_unknown"):
            assert f"\n{outcome} " in result.stdout, f"run {run + 1}:\n{output}"
        for name, pid in started_processes(result.stdout).items():
            assert not alive(pid), f"{name} (pid {pid}) outlived run {run + 1}"
        ledger_id, location, origin = _binding(env)
        assert origin is LedgerOrigin.PRIVATE
        ledgers.append((ledger_id, location))
    assert len({ledger_id for ledger_id, _ in ledgers}) == 3, ledgers


def test_dev_twice_on_one_database_serves_calls_and_beat_sweeps(tmp_path: Path) -> None:
    """The second `dev` on the first one's SQLite file serves a call end to end; neither its
    worker nor its beat logs a refusal or a failed sweep."""
    from config.celery_app import create_app  # deferred: the reference deployment's tools

    env = stack_environment(tmp_path)
    first_out, second_out = tmp_path / "dev-1.out", tmp_path / "dev-2.out"
    first = start_dev("config.celery_app", env, first_out)
    try:
        wait_dev_ready(first, first_out)
    finally:
        stop_dev(first, first_out)
    first_ledger = _binding(env)[0]

    second = start_dev("config.celery_app", env, second_out)
    try:
        redis_url = wait_dev_ready(second, second_out)
        _app, dex, desk = create_app(Settings.from_env({**env, "DEX_REDIS_URL": redis_url}))
        order = desk.add_order(customer="Ada Lovelace", total_cents=4200)
        client = dex.client()
        record = client.request_call("dev2", "t1", "c1", "lookup_order", {"order_id": order.id})
        (done,) = client.wait([record.key], timeout=60)
        assert done.status is CallStatus.SUCCEEDED, done.error
        # Beat sweeps every 2 s in dev: one of its sweeps ran on the new ledger, without errors.
        wait_for(
            lambda: (sweep := last_sweep(dex.ledger)) is not None and sweep.errors == 0,
            timeout=30,
            what="beat's sweeper to sweep the new ledger",
        )
        dex.ledger.client.close()
    finally:
        stop_dev(second, second_out)
    output = second_out.read_text()
    assert "LedgerMismatch" not in output, output[-3000:]
    assert "sweep failed" not in output, output[-3000:]
    ledger_id, _location, origin = _binding(env)
    assert ledger_id != first_ledger
    assert origin is LedgerOrigin.PRIVATE


def test_a_demo_on_a_configured_ledgers_database_says_how_to_recover_and_then_runs(
    tmp_path: Path,
) -> None:
    """A database a configured deployment used (its Redis elsewhere) is never taken over by
    itself: the demo ends with one `error:` line naming the command, which runs as pasted, and
    the next demo runs."""
    env = stack_environment(tmp_path)
    _bound_to_a_configured_ledger(env)

    def demo() -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [str(SCRIPT), "demo"],
            cwd=tmp_path,
            env=env,
            capture_output=True,
            text=True,
            timeout=150,
        )

    refused = demo()
    assert refused.returncode == 1, refused.stdout + refused.stderr
    (line,) = [x for x in refused.stderr.splitlines() if x.strip()]
    assert line.startswith("error: LedgerMismatch: this database belongs to the ledger at 10.1.2.3")
    command = re.search(r"`(dex-celery -A \S+ db rebind-ledger --release --yes)`", line)
    assert command, line
    words = shlex.split(command.group(1))
    recovered = subprocess.run(
        [str(SCRIPT), *words[1:]],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert recovered.returncode == 0, recovered.stdout + recovered.stderr
    assert _binding_or_none(env) is None

    ran = demo()
    assert ran.returncode == 0, ran.stdout + ran.stderr
    assert _binding(env)[2] is LedgerOrigin.PRIVATE


def test_dev_on_a_configured_ledgers_database_refuses_before_starting_and_says_how_to_recover(
    tmp_path: Path,
) -> None:
    """`dev` refuses in one `error:` line before its worker and beat start (nothing left
    running); the command it names runs as pasted; then `dev` serves."""
    env = stack_environment(tmp_path)
    _bound_to_a_configured_ledger(env)
    out = tmp_path / "dev-1.out"
    refused = start_dev("config.celery_app", env, out)
    assert refused.wait(timeout=90) == 1, out.read_text()
    output = out.read_text()
    errors = [line for line in output.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "Traceback" not in output, output
    assert set(started_processes(output)) == {"redis-server"}, output
    for name, pid in started_processes(output).items():
        assert not alive(pid), f"{name} (pid {pid}) outlived the refused dev"
    command = re.search(
        r"`(dex-celery -A config\.celery_app db rebind-ledger --release --yes)`", errors[0]
    )
    assert command, errors[0]
    recovered = subprocess.run(
        [str(SCRIPT), *shlex.split(command.group(1))[1:]],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert recovered.returncode == 0, recovered.stdout + recovered.stderr

    second_out = tmp_path / "dev-2.out"
    second = start_dev("config.celery_app", env, second_out)
    try:
        wait_dev_ready(second, second_out)
    finally:
        stop_dev(second, second_out)
    assert _binding(env)[2] is LedgerOrigin.PRIVATE


def _bound_to_a_configured_ledger(env: dict[str, str]) -> None:
    """The database a deployment with its own, configured Redis used (not this machine's)."""
    upgrade(env["DEX_DATABASE_URL"])
    engine = make_engine(env["DEX_DATABASE_URL"])
    try:
        bind(engine, "a-configured-ledger", "10.1.2.3:6379/0 dex", time.time())
    finally:
        engine.dispose()


def _binding_or_none(env: dict[str, str]) -> object:
    engine = make_engine(env["DEX_DATABASE_URL"])
    try:
        return read_binding(engine)
    finally:
        engine.dispose()
