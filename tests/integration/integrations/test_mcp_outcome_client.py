"""dex-celery's MCP client with a server of the outcome extension (docs/mcp-outcome-extension.md)
and with one without it: `devtools.mcp_outcome_server`, written with the `mcp` SDK alone as
another project would, behind a TCP proxy the test cuts mid-call; real workers; the server's own
log of runs as the witness.

With the extension the client re-sends the call's key after a dropped connection and records
the same call's outcome (one run, `succeeded`); `not_executed` becomes "did not run" (S4.2) and
`unknown` an unknown outcome (S4.5). Without it, today's rules: a dropped connection makes the
write `outcome_unknown` (S4.3) and an error answer a failure of the tool.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from devtools.mcp_outcome_server import OFF_ENV, runs
from devtools.mcp_tools_server import LOG_ENV
from devtools.processes import ROOT, CeleryWorker, free_port, wait_for
from dex_celery import CallStatus, Dex, Settings
from dex_celery.model.outcomes import DID_NOT_RUN
from dex_celery.testing.tcpproxy import TcpProxy
from tests.support.faults.crash import wait_finished
from tests.support.mcp.outcome_app import URL_ENV, make_app
from tests.support.mcp.server import _listening
from tests.support.processes.workers import each_stopped, mcp_worker

pytestmark = pytest.mark.crash


@pytest.fixture(params=["extension", "plain"])
def flavour(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture
def bank(
    env: dict[str, str], tmp_path: Path, flavour: str
) -> Iterator[tuple[dict[str, str], TcpProxy]]:
    """The outcome server over HTTP behind a proxy, and the env of the app that uses it."""
    folder = tmp_path / "mcp-log"
    folder.mkdir()
    port = free_port()
    server_env = {LOG_ENV: str(folder), "PYTHONPATH": str(ROOT)}
    if flavour == "plain":
        server_env[OFF_ENV] = "1"
    process = subprocess.Popen(
        [sys.executable, "-m", "devtools.mcp_outcome_server", "--http", str(port)],
        cwd=ROOT,
        env={**os.environ, **server_env},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        wait_for(lambda: _listening(port), timeout=30, what="the outcome server to listen")
        with TcpProxy(port) as proxy:
            app_env = {
                **env,
                **server_env,
                URL_ENV: f"http://127.0.0.1:{proxy.port}/mcp",
            }
            app_env.pop(OFF_ENV, None)
            yield app_env, proxy
    finally:
        process.kill()
        process.wait(timeout=10)


@pytest.fixture
def bank_dex(bank: tuple[dict[str, str], TcpProxy], monkeypatch: pytest.MonkeyPatch) -> Dex:
    app_env, _ = bank
    for name, value in app_env.items():
        monkeypatch.setenv(name, value)
    _app, dex = make_app(Settings.from_env(app_env))
    dex.store.create_schema()
    return dex


@pytest.fixture
def bank_worker(
    bank: tuple[dict[str, str], TcpProxy],
) -> Iterator[Callable[[], CeleryWorker]]:
    def start() -> CeleryWorker:
        return mcp_worker(bank[0], module="tests.support.mcp.outcome_app")

    yield from each_stopped(start)


def test_a_dropped_connection_resends_the_key_and_records_the_same_calls_outcome(
    flavour: str,
    bank: tuple[dict[str, str], TcpProxy],
    bank_dex: Dex,
    bank_worker: Callable[[], CeleryWorker],
) -> None:
    app_env, proxy = bank
    log = Path(app_env[LOG_ENV])
    (log / "hold").write_text("")
    bank_worker()
    calls = bank_dex.client()
    key = calls.request_call("bank-s", "t1", "c1", "charge", {"amount": 7}).key
    wait_for(lambda: ("start", key) in runs(), timeout=60, what="the charge to start")
    assert proxy.cut() >= 1  # the response stream breaks while the server runs the write
    wait_for(proxy.restored, timeout=10, what="the link back")
    (log / "release").write_text("")
    record = wait_finished(bank_dex, key, timeout=90)

    assert [k for kind, k in runs() if kind == "start"] == [key]  # one run either way
    if flavour == "extension":
        # The re-sent key got the first send's answer: the call ran once and says so.
        assert record.status is CallStatus.SUCCEEDED, record
        assert record.result == '"charged 7"'  # the value, as JSON text
    else:
        # Plain MCP cannot say: the write may have run (S4.3).
        assert record.status is CallStatus.OUTCOME_UNKNOWN, record
    assert record.attempts == 1


def test_the_servers_stated_outcome_decides_the_record(
    flavour: str, bank_dex: Dex, bank_worker: Callable[[], CeleryWorker]
) -> None:
    bank_worker()
    calls = bank_dex.client()
    refused = calls.request_call("bank-s", "t2", "refused", "refuse", {"amount": 10**6}).key
    vague = calls.request_call("bank-s", "t2", "vague", "vague", {"amount": 3}).key
    refused_record = wait_finished(bank_dex, refused)
    vague_record = wait_finished(bank_dex, vague)

    assert refused_record.status is CallStatus.FAILED
    assert "over the limit" in (refused_record.error or "")
    if flavour == "extension":
        # `not_executed`: nothing took effect (S4.2); `unknown`: it may have (S4.5).
        assert (refused_record.error or "").startswith(DID_NOT_RUN), refused_record.error
        assert vague_record.status is CallStatus.OUTCOME_UNKNOWN, vague_record
    else:
        # An error answer of plain MCP is a failure of the tool; it ran, as far as dex can tell.
        assert not (refused_record.error or "").startswith(DID_NOT_RUN)
        assert vague_record.status is CallStatus.FAILED, vague_record
