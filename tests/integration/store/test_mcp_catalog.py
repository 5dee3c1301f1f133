"""MCP tool lists kept in the database (docs/semantics.md, "MCP servers"): registering a server
connects to nothing, read-only commands start no server process, one dead server affects only
calls of its own tools, and a tool whose definition changed waits for approval until a person
accepts it. Real MCP server processes (the project's test server, `mcp-server-git` from PyPI),
real prefork Celery workers, a real redis-server.

Witnesses: the test server writes one line per process start (`starts.log`), the SQL record,
the events stream, and each server's own call log.
"""

from __future__ import annotations

import json
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner, Result

from devtools.mcp_tools_server import LOG_ENV, calls
from devtools.processes import ROOT, CeleryWorker, free_port, wait_for
from dex_celery import (
    DID_NOT_RUN,
    CallStatus,
    Dex,
    EventType,
    McpServerUnavailable,
    Settings,
    UnknownCall,
    UnknownTool,
)
from dex_celery.cli.main import main
from dex_celery.store.mcp_catalog import McpCatalog, McpToolDefinition
from tests.support.faults.crash import wait_finished
from tests.support.mcp import tools_app
from tests.support.mcp.gitapp import REPO_ENV as GIT_REPO_ENV
from tests.support.mcp.gitapp import make_app as make_git_app
from tests.support.mcp.tools_app import DEAD_ENV, DEAD_URL_ENV, READY_ENV, make_app
from tests.support.processes.workers import each_stopped, mcp_worker

pytestmark = pytest.mark.crash

APP = "tests.support.mcp.tools_app:dex"

READ_ONLY = (
    ("status",),
    ("status", "--json"),
    ("calls", "list"),
    ("approvals", "list"),
    ("webhooks", "status"),
    ("mcp-servers", "list"),
    ("mcp-servers", "list", "--json"),
)


@pytest.fixture
def mcp_env(env: dict[str, str], tmp_path: Path) -> dict[str, str]:
    folder = tmp_path / "mcp-log"
    (folder / "flaky").mkdir(parents=True)
    return {
        **env,
        LOG_ENV: str(folder),
        "PYTHONPATH": str(ROOT),
        DEAD_ENV: "1",
        DEAD_URL_ENV: f"http://127.0.0.1:{free_port()}/mcp",
    }


@pytest.fixture
def mcp_dex(mcp_env: dict[str, str], monkeypatch: pytest.MonkeyPatch) -> Dex:
    for name, value in mcp_env.items():
        monkeypatch.setenv(name, value)
    app, dex = make_app(Settings.from_env(mcp_env))
    dex.store.create_schema()
    monkeypatch.setitem(tools_app._built, "app", app)
    monkeypatch.setitem(tools_app._built, "dex", dex)
    return dex


@pytest.fixture
def cli(mcp_dex: Dex) -> Callable[..., Result]:
    def run(*args: str, code: int = 0) -> Result:
        result = CliRunner().invoke(main, ["--app", APP, *args], catch_exceptions=False)
        assert result.exit_code == code, (args, result.output)
        return result

    return run


@pytest.fixture
def start_worker(mcp_env: dict[str, str]) -> Iterator[Callable[..., CeleryWorker]]:
    def start() -> CeleryWorker:
        return mcp_worker(mcp_env)

    yield from each_stopped(start)


def _starts(mcp_env: dict[str, str]) -> list[str]:
    """Every start of a test server process, the `flaky` server's included."""
    log = Path(mcp_env[LOG_ENV])
    return [
        line
        for path in (log / "starts.log", log / "flaky" / "starts.log")
        if path.exists()
        for line in path.read_text().split()
    ]


def _servers(cli: Callable[..., Result]) -> dict[str, dict[str, Any]]:
    listed = json.loads(cli("mcp-servers", "list", "--json").output)
    return {s["name"]: s for s in listed}


def test_registering_connects_to_nothing_and_read_only_commands_start_no_server(
    mcp_dex: Dex, mcp_env: dict[str, str], cli: Callable[..., Result]
) -> None:
    """Four servers registered, two of them dead: the app loads and every read-only command
    answers without starting one server process; `mcp-servers refresh` is what starts them."""
    assert _starts(mcp_env) == []
    for args in READ_ONLY:
        cli(*args)
    cli("calls", "show", "s/t/c", code=1)  # unknown call: the typed answer, no server started
    assert _starts(mcp_env) == []
    status = json.loads(cli("status", "--json").output)["sections"]["mcp_servers"]
    assert [s["name"] for s in status["servers"]] == ["orders", "gone", "gone_http", "flaky"]
    assert {s["state"] for s in status["servers"]} == {"never fetched"}
    assert status["state"] == "warn"

    refreshed = cli("mcp-servers", "refresh", "orders").output
    assert "orders: 8 tools" in refreshed
    assert len(_starts(mcp_env)) == 1
    servers = _servers(cli)
    assert (servers["orders"]["state"], servers["orders"]["tools"]) == ("ok", 8)
    assert servers["orders"]["fetched_at"] is not None
    assert "orders  ok  tools 8  fetched 20" in cli("mcp-servers", "list").output

    # Every server: the dead ones are named, one line each; the others are refreshed.
    out = cli("mcp-servers", "refresh", code=1).output
    assert "gone: cannot list the tools of MCP server 'gone'" in out
    assert "gone_http: cannot list the tools of MCP server 'gone_http'" in out
    assert "flaky: 8 tools" in out
    for args in READ_ONLY:
        cli(*args)
    assert len(_starts(mcp_env)) == 3  # orders twice, flaky once: the read-only ones none
    status = json.loads(cli("status", "--json").output)["sections"]["mcp_servers"]
    states = {s["name"]: s for s in status["servers"]}
    assert states["gone"]["state"] == "not reached"
    assert "cannot list the tools" in states["gone"]["last_error"]
    assert states["gone_http"]["state"] == "not reached"
    assert states["flaky"]["tools"] == 8
    assert "gone not reached" in cli("status").output


def test_a_dead_server_leaves_every_other_tool_and_the_worker_working(
    mcp_dex: Dex,
    mcp_env: dict[str, str],
    cli: Callable[..., Result],
    start_worker: Callable[..., CeleryWorker],
) -> None:
    """`gone` never answered: a request for its tool is the typed error naming it, nothing is
    recorded. `flaky` was listed once, then stopped starting: the worker starts anyway (with its
    kept list) and a call of its tool ends "did not run". Every other tool runs."""
    assert mcp_dex.get_tool("f_lookup").name == "f_lookup"  # lists `flaky` while it works
    (Path(mcp_env[LOG_ENV]) / "flaky" / "fail-start").write_text("1")
    start_worker()
    client = mcp_dex.client()

    record = client.request_call("s1", "t1", "a", "lookup", {"order_id": "A"})
    (done,) = client.wait([record.key], timeout=60)
    assert done.status is CallStatus.SUCCEEDED, done

    for tool, server in (("g_lookup", "gone"), ("gh_lookup", "gone_http")):
        with pytest.raises(McpServerUnavailable, match=f"MCP server '{server}'") as raised:
            client.request_call("s1", "t2", f"x-{tool}", tool, {"order_id": "A"})
        assert raised.value.server == server
        with pytest.raises(UnknownCall):  # refused before anything was written
            client.get_call(f"s1/t2/x-{tool}")

    record = client.request_call("s1", "t3", "f", "f_lookup", {"order_id": "A"})
    failed = wait_finished(mcp_dex, record.key, timeout=120)
    assert failed.status is CallStatus.FAILED, failed
    assert (failed.error or "").startswith(DID_NOT_RUN), failed.error
    assert [t for t, _, _ in calls() if t == "lookup"] == ["lookup"]  # only the orders call ran

    # The CLI still answers every command, the dead servers shown in `status`.
    for args in READ_ONLY:
        cli(*args)
    states = _servers(cli)
    assert states["flaky"]["state"] == "unreachable" and states["flaky"]["tools"] == 8
    assert states["gone"]["state"] == "not reached"


def test_a_changed_definition_waits_for_approval_until_accepted_and_an_event_says_so(
    mcp_dex: Dex,
    mcp_env: dict[str, str],
    cli: Callable[..., Result],
    start_worker: Callable[..., CeleryWorker],
) -> None:
    """The worker pins each tool's definition at its first fetch. The server then changes
    `lookup` (schema and annotations); `mcp-servers refresh` reads the list anew, an event names
    the tool, and `lookup` waits for approval in every process until `mcp-servers accept`."""
    start_worker()
    client = mcp_dex.client()
    first = client.request_call("s1", "t1", "a", "lookup", {"order_id": "A"})
    (done,) = client.wait([first.key], timeout=60)
    assert done.status is CallStatus.SUCCEEDED, done
    position = mcp_dex.events.latest_position()

    (Path(mcp_env[LOG_ENV]) / "variant").write_text("changed")
    out = cli("mcp-servers", "refresh", "orders").output
    assert "orders: changed since accepted (approval required): lookup" in out

    def changed_event() -> Any:
        events = mcp_dex.events.read(position, count=1000)
        found = [e for e in events if e.type is EventType.MCP_TOOL_DEFINITION_CHANGED]
        return found or None

    wait_for(changed_event, timeout=30, what="the changed-definition event")
    (event,) = changed_event()
    assert (event.fields["server"], event.fields["tool"]) == ("orders", "lookup")
    assert _servers(cli)["orders"]["changed"] == ["lookup"]
    assert "changed (approval required): lookup" in cli("mcp-servers", "list").output

    held = client.request_call("s1", "t3", "c", "lookup", {"order_id": "B"})
    assert held.status is CallStatus.AWAITING_APPROVAL, held
    # Other tools of the server are not held.
    other = client.request_call("s1", "t3", "d", "slow_lookup", {})
    assert other.status is not CallStatus.AWAITING_APPROVAL

    out = cli("mcp-servers", "accept", "orders", "--by", "ann").output
    assert "accepted lookup" in out
    assert _servers(cli)["orders"]["changed"] == []
    after = client.request_call("s1", "t4", "e", "lookup", {"order_id": "C"})
    (done,) = client.wait([after.key], timeout=60)
    assert done.status is CallStatus.SUCCEEDED, done
    (Path(mcp_env[LOG_ENV]) / "release").write_text("1")


def _changed(mcp_dex: Dex, server: str) -> None:
    """`server`'s kept list as first fetched (pinned), then with `lookup` changed, as a
    refresh would keep it: no server process is needed for `accept`."""
    catalog = McpCatalog(mcp_dex.store)
    schema = {"type": "object", "properties": {"order_id": {"type": "string"}}}
    first = McpToolDefinition.of("lookup", "Read an order.", schema, {"readOnlyHint": True})
    other = McpToolDefinition.of("slow_lookup", "Read slowly.", schema, {"readOnlyHint": True})
    assert catalog.save_tools(server, "cmd", [first, other]) == ()
    changed = McpToolDefinition.of("lookup", "Read an order.", schema, {"readOnlyHint": False})
    assert catalog.save_tools(server, "cmd", [changed, other]) == ("lookup",)


@pytest.mark.parametrize("named", ["lookup", "f_lookup"])
def test_accept_takes_the_servers_tool_name_or_the_dex_name(
    mcp_dex: Dex, cli: Callable[..., Result], named: str
) -> None:
    """`flaky` registers its tools as `f_<name>`: `approvals list` shows `f_lookup`, the server
    lists `lookup`; either accepts the change, and asking again says there is nothing to."""
    _changed(mcp_dex, "flaky")
    out = cli("mcp-servers", "accept", "flaky", named, "--by", "ann").output
    assert out.strip() == "flaky: accepted lookup"
    assert _servers(cli)["flaky"]["changed"] == []
    again = cli("mcp-servers", "accept", "flaky", named, "--by", "ann").output
    assert again.startswith("flaky: nothing to accept for lookup"), again


def test_accept_of_a_tool_the_server_does_not_have_is_an_error(
    mcp_dex: Dex, cli: Callable[..., Result]
) -> None:
    _changed(mcp_dex, "flaky")
    for unknown in ("lokup", "flaky_lookup", "g_lookup"):
        result = cli("mcp-servers", "accept", "flaky", unknown, "lookup", "--by", "ann", code=1)
        lines = result.output.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("error: "), result.output
        assert (
            f"no tool '{unknown}'" in lines[0] and "dex names: f_lookup, f_slow_lookup" in lines[0]
        )
    assert _servers(cli)["flaky"]["changed"] == ["lookup"]  # nothing was accepted


def test_a_mistyped_tool_name_is_an_unknown_tool_naming_the_tools_not_a_dead_server(
    mcp_dex: Dex,
) -> None:
    """`orders` and `down` have no prefix, so any name might be theirs; `down` never answers.
    A typo is still `UnknownTool` listing what exists, not `down`'s error; nothing is recorded.
    A name only `gone` can have (its prefix) is still `gone`'s `McpServerUnavailable`."""
    assert mcp_dex.get_tool("lookup").name == "lookup"  # lists `orders`
    mcp_dex.add_mcp_server("down", url=f"http://127.0.0.1:{free_port()}/mcp", connect_timeout=5)
    client = mcp_dex.client()
    with pytest.raises(UnknownTool) as raised:
        client.request_call("s1", "t1", "a", "lokup", {"order_id": "A"})
    assert type(raised.value) is UnknownTool
    assert "no tool named 'lokup'" in str(raised.value) and "lookup" in str(raised.value)
    assert "'down'" in str(raised.value)  # mentioned as not listed, not blamed
    with pytest.raises(UnknownCall):
        client.get_call("s1/t1/a")
    with pytest.raises(McpServerUnavailable, match="'gone'"):
        client.request_call("s1", "t1", "b", "g_lokup", {"order_id": "A"})


def test_mcp_server_git_tools_run_on_a_prefork_worker_over_one_warm_session(
    tmp_path: Path, env: dict[str, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """`mcp-server-git` (PyPI): `git_status` of a repository the test makes, called three times
    through a real prefork worker, all on one server process; its destructive `git_reset`
    waits for approval although the server marks it idempotent."""
    repo = tmp_path / "repo"
    repo.mkdir()
    subprocess.run(["git", "init", "-q", str(repo)], check=True)
    (repo / "new.txt").write_text("hello")
    folder = tmp_path / "gitlog"
    folder.mkdir()
    git_env = {**env, "PYTHONPATH": str(ROOT), GIT_REPO_ENV: str(repo), LOG_ENV: str(folder)}
    for name, value in git_env.items():
        monkeypatch.setenv(name, value)
    _app, dex = make_git_app(Settings.from_env(git_env))
    dex.store.create_schema()
    worker = CeleryWorker(
        "tests.support.mcp.gitapp", git_env, folder / "worker", concurrency=1, ready_env=READY_ENV
    ).start()
    try:
        client = dex.client()
        keys = []
        for n in range(3):
            record = client.request_call(
                "s1", f"t{n}", "st", "git_git_status", {"repo_path": str(repo)}
            )
            (done,) = client.wait([record.key], timeout=90)
            assert done.status is CallStatus.SUCCEEDED, done
            assert "new.txt" in (done.result or ""), done.result
            keys.append(record.key)
        reset = client.request_call("s1", "t9", "r", "git_git_reset", {"repo_path": str(repo)})
        assert reset.status is CallStatus.AWAITING_APPROVAL, reset
        assert reset.effect.value == "idempotent_write"
        witness = folder / "opened"
        wait_for(
            lambda: witness.exists() and witness.read_text().split()[1] == "3",
            timeout=30,
            what="the worker to count its sessions after the third call",
        )
        opened, _tasks = witness.read_text().split()
        assert opened == "1", opened  # one server process for the three calls
    finally:
        worker.stop()
