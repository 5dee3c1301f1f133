"""dex-celery's MCP client follows a remote tool call as a task (docs/mcp.md, "dex-celery as a
client of servers of the newest revision"): two deployments with real workers. The remote one
is `devtools.toolapp` served by `dex-celery mcp --transport http` (which offers the tasks
extension) behind a TCP proxy the test cuts; the local one (`tests.support.mcp.remote_tasks_app`,
its own database, Redis database and queues) has the remote tools as dex tools. Witnesses: both
deployments' records and the remote tools' own side-effect log (`tests.support.faults.crash.lines`).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

import pytest

from devtools.mcp_tools_server import LOG_ENV as MCP_LOG_ENV
from devtools.processes import CeleryWorker, Worker, wait_for
from devtools.toolapp import LOG_ENV
from dex_celery import CallStatus, Dex, Settings
from dex_celery.model.outcomes import DID_NOT_RUN
from dex_celery.testing.tcpproxy import TcpProxy
from tests.support.faults.crash import lines, wait_finished, wait_started
from tests.support.mcp.remote_tasks_app import SHORT_LIMIT, URL_ENV, make_app
from tests.support.mcp.server import _server
from tests.support.processes.workers import each_stopped, mcp_worker

pytestmark = pytest.mark.crash


@dataclass
class Local:
    """The local deployment: its dex (records), its worker, the proxy to the remote server."""

    dex: Dex
    worker: CeleryWorker
    proxy: TcpProxy

    def log(self) -> str:
        return self.worker.logfile.read_text(errors="replace")


@pytest.fixture
def local(
    dex: Dex,
    env: dict[str, str],
    tmp_path: Path,
    start_worker: Callable[..., Worker],
    monkeypatch: pytest.MonkeyPatch,
) -> Iterator[Local]:
    start_worker()  # the remote deployment's worker
    with _server("http", env) as url:
        port = urlsplit(url).port
        assert port is not None
        with TcpProxy(port) as proxy:
            folder = tmp_path / "local-log"
            folder.mkdir()
            local_env = {
                **env,
                "DEX_REDIS_URL": env["DEX_REDIS_URL"].rsplit("/", 1)[0] + "/1",
                "DEX_DATABASE_URL": f"sqlite:///{tmp_path / 'local.db'}",
                "DEX_KEY_PREFIX": env["DEX_KEY_PREFIX"] + "local",
                URL_ENV: f"http://127.0.0.1:{proxy.port}/mcp",
                MCP_LOG_ENV: str(folder),
            }
            monkeypatch.setenv(URL_ENV, local_env[URL_ENV])
            _app, local_dex = make_app(Settings.from_env(local_env))
            local_dex.store.create_schema()
            for worker in each_stopped(lambda: mcp_worker(local_env, module=_MODULE)):
                yield Local(local_dex, worker(), proxy)


_MODULE = "tests.support.mcp.remote_tasks_app"


def test_a_long_remote_write_runs_once_as_a_task_and_succeeds(local: Local) -> None:
    key = (
        local.dex.client()
        .request_call(
            "far", "t1", "c1", "r_slow_non_idempotent_write", {"seconds": 3, "value": {"paid": 7}}
        )
        .key
    )
    record = wait_finished(local.dex, key, timeout=60)

    assert record.status is CallStatus.SUCCEEDED, record
    assert json.loads(record.result or "") == {"paid": 7}
    assert record.attempts == 1
    # Sent with its key: the remote call is the same key, run once, and was followed as a task.
    assert len(lines(key, "start")) == 1
    assert f"runs as task {key}" in local.log()


def test_a_connection_cut_mid_task_follows_the_same_task_to_its_result(
    dex: Dex, env: dict[str, str], local: Local
) -> None:
    key = (
        local.dex.client()
        .request_call(
            "far",
            "t2",
            "c1",
            "r_slow_non_idempotent_write",
            {"seconds": 60, "value": {"once": True}},
        )
        .key
    )
    wait_started(key)
    wait_for(lambda: f"runs as task {key}" in local.log(), timeout=30, what="the task")
    local.proxy.cut()  # polls fail while the link is down: the client opens it again
    again = f"asking for task {key} again"  # never the tool again: the same task id
    wait_for(lambda: again in local.log(), timeout=30, what="a broken poll")
    wait_for(local.proxy.restored, timeout=10, what="the link back")
    (Path(env[LOG_ENV]) / "release").write_text("")
    record = wait_finished(local.dex, key, timeout=60)

    assert record.status is CallStatus.SUCCEEDED, record
    assert json.loads(record.result or "") == {"once": True}
    assert record.attempts == 1
    assert len(lines(key, "start")) == 1  # one run on the remote side
    remote = dex.store.get_call(key)
    assert remote is not None and remote.status is CallStatus.SUCCEEDED
    assert "sending tools/call with its key again" not in local.log()


def test_a_remote_write_still_running_at_the_time_limit_is_cancelled_and_unknown(
    dex: Dex, env: dict[str, str], local: Local
) -> None:
    key = (
        local.dex.client()
        .request_call("far", "t3", "c1", "s_slow_non_idempotent_write", {"seconds": 60})
        .key
    )
    record = wait_finished(local.dex, key, timeout=SHORT_LIMIT + 30)

    # It may have run (it did: it is running): a write is `outcome_unknown` (S4.3, S4.5).
    assert record.status is CallStatus.OUTCOME_UNKNOWN, record
    assert "tasks/cancel" in (record.error or ""), record.error
    assert "may_still_run" in (record.error or ""), record.error
    assert len(lines(key, "start")) == 1
    # The remote call could not be taken back; it ends on its own, once, and says so there.
    (Path(env[LOG_ENV]) / "release").write_text("")
    remote = wait_finished(dex, key, timeout=60)
    assert remote.status is CallStatus.SUCCEEDED
    assert len(lines(key, "start")) == 1


def test_a_remote_approval_keeps_the_attempt_waiting_then_is_cancelled_not_executed(
    dex: Dex, local: Local
) -> None:
    key = (
        local.dex.client()
        .request_call("far", "t4", "c1", "s_guarded_write", {"value": "never"})
        .key
    )
    wait_for(lambda: "waits for input there" in local.log(), timeout=30, what="the report")
    assert dex.store.get_call(key) is not None
    assert local.dex.store.get_call(key).status is CallStatus.PENDING  # type: ignore[union-attr]
    record = wait_finished(local.dex, key, timeout=SHORT_LIMIT + 30)

    # `tasks/cancel` rejected the remote call before it ran: it did not run (S4.2).
    assert record.status is CallStatus.FAILED, record
    assert (record.error or "").startswith(DID_NOT_RUN), record.error
    remote = dex.store.get_call(key)
    assert remote is not None and remote.status is CallStatus.REJECTED
    assert lines(key, "start") == []
