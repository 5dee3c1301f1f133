"""`dex-celery demo` and `dex-celery dev` a second (and third) time on one SQLite file.

The first run binds the database to the ledger in its private Redis (docs/ledger.md, "One
database, one ledger"); that Redis is gone when the run ends. The next run starts a private
Redis of its own: the database recovers by itself (a new ledger, the calls in flight judged
from SQL as after a rollback, S10.2, S10.3) instead of refusing with `LedgerMismatch`, and
beat sweeps without a failure.

A database a configured deployment used (its Redis elsewhere) is never taken over by itself:
`demo` and `dev` end with one `error:` line naming the command that recovers, which runs as
pasted. Each test starts from such a database, recovers, then runs the stack again and again
(the stacks take a while to start: one test each for `demo` and `dev`).
"""

from __future__ import annotations

import re
import shlex
import subprocess
import time
from pathlib import Path

from devtools.processes import ROOT, wait_for
from dex_celery import CallStatus, Settings
from dex_celery.engine.counters import last_sweep
from dex_celery.store.bindings import Binding, LedgerOrigin, bind, read_binding
from dex_celery.store.migrate import upgrade
from dex_celery.store.sql_engine import make_engine
from tests.support.processes.dev_stack import (
    SCRIPT,
    alive,
    stack_environment,
    start_dev,
    started_processes,
    stop_dev,
    wait_dev_ready,
)

#: Where the configured deployment's Redis was (not on this machine).
CONFIGURED = "10.1.2.3:6379/0 dex"


def _binding(env: dict[str, str]) -> Binding | None:
    engine = make_engine(env["DEX_DATABASE_URL"])
    try:
        return read_binding(engine)
    finally:
        engine.dispose()


def _bound_to_a_configured_ledger(env: dict[str, str]) -> None:
    upgrade(env["DEX_DATABASE_URL"])
    engine = make_engine(env["DEX_DATABASE_URL"])
    try:
        bind(engine, "a-configured-ledger", CONFIGURED, time.time())
    finally:
        engine.dispose()


def _recover_as_told(error: str, app: str, env: dict[str, str], cwd: Path) -> None:
    """Run the command the `error:` line names, as pasted, in `cwd` (where `app` imports, as
    the refused command ran): the database is then released."""
    command = re.search(
        rf"`(dex-celery -A {re.escape(app)} db rebind-ledger --release --yes)`", error
    )
    assert command, error
    recovered = subprocess.run(
        [str(SCRIPT), *shlex.split(command.group(1))[1:]],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert recovered.returncode == 0, recovered.stdout + recovered.stderr
    assert _binding(env) is None


def test_the_demo_recovers_as_told_then_runs_three_times_on_one_database(tmp_path: Path) -> None:
    """On a configured ledger's database: one `error:` line naming the command. Then each run
    binds the database to its own private Redis, the one before it being gone: all three exit
    0 and show every outcome; each run's ledger is a new one."""
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
    assert line.startswith(
        f"error: LedgerMismatch: this database belongs to the ledger at {CONFIGURED}"
    )
    # Refused before its worker and beat started; its private Redis stopped.
    assert set(started_processes(refused.stdout)) == {"redis-server"}, refused.stdout
    for name, pid in started_processes(refused.stdout).items():
        assert not alive(pid), f"{name} (pid {pid}) outlived the refused demo"
    _recover_as_told(line, "dex_celery.examples.orderdesk.app", env, tmp_path)

    ledgers = []
    for run in range(3):
        result = demo()
        output = result.stdout + result.stderr
        assert result.returncode == 0, f"run {run + 1}:\n{output}"
        assert "LedgerMismatch" not in output
        for outcome in ("succeeded", "failed", "rejected", "outcome_unknown"):
            assert f"\n{outcome} " in result.stdout, f"run {run + 1}:\n{output}"
        for name, pid in started_processes(result.stdout).items():
            assert not alive(pid), f"{name} (pid {pid}) outlived run {run + 1}"
        binding = _binding(env)
        assert binding is not None and binding.origin is LedgerOrigin.PRIVATE
        ledgers.append((binding.ledger_id, binding.location))
    assert len({ledger_id for ledger_id, _ in ledgers}) == 3, ledgers


def test_dev_recovers_as_told_then_runs_twice_on_one_database(tmp_path: Path) -> None:
    """On a configured ledger's database `dev` refuses before its worker and beat start, in one
    `error:` line, nothing left running. After the command it names, `dev` runs; the second
    `dev` on the first one's file serves a call end to end, and neither its worker nor its beat
    logs a refusal or a failed sweep."""
    from dex_celery.examples.orderdesk.app import (
        create_app,  # deferred: the reference deployment's tools
    )

    app = "dex_celery.examples.orderdesk.app"
    env = stack_environment(tmp_path)
    _bound_to_a_configured_ledger(env)
    refused_out = tmp_path / "dev-0.out"
    refused = start_dev(app, env, refused_out)
    assert refused.wait(timeout=90) == 1, refused_out.read_text()
    output = refused_out.read_text()
    errors = [line for line in output.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "Traceback" not in output, output
    assert set(started_processes(output)) == {"redis-server"}, output
    for name, pid in started_processes(output).items():
        assert not alive(pid), f"{name} (pid {pid}) outlived the refused dev"
    _recover_as_told(errors[0], app, env, ROOT)  # where dev ran: `config` imports there

    first_out, second_out = tmp_path / "dev-1.out", tmp_path / "dev-2.out"
    first = start_dev(app, env, first_out)
    try:
        wait_dev_ready(first, first_out)
    finally:
        stop_dev(first, first_out)
    first_binding = _binding(env)
    assert first_binding is not None and first_binding.origin is LedgerOrigin.PRIVATE

    second = start_dev(app, env, second_out)
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
    assert "cannot sweep" not in output and "sweep failed" not in output, output[-3000:]
    binding = _binding(env)
    assert binding is not None and binding.origin is LedgerOrigin.PRIVATE
    assert binding.ledger_id != first_binding.ledger_id
