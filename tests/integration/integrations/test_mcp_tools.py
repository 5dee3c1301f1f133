"""MCP servers' tools as dex tools: a real MCP server subprocess (the `mcp` SDK's `MCPServer`),
real Celery workers, a real redis-server.

Witnesses: the SQL record and the server's own call log (`mcp_tools_server.calls`), which also
shows the idempotency key each call carried in its `_meta`.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from devtools.mcp_tools_server import (
    EXTRA_TOOL_ENV,
    HEADER,
    LOG_ENV,
    calls,
    closed_sessions,
    headers_seen,
    lookup_sessions,
    traceparents,
)
from devtools.processes import ROOT, CeleryWorker, free_port, wait_for
from dex_celery import (
    DID_NOT_RUN,
    OUTCOME_UNKNOWN_TOOL_RESULT,
    CallStatus,
    ConfigurationError,
    Dex,
    EffectClass,
    InvalidArguments,
    McpServerUnavailable,
    RetryableToolError,
    Settings,
    ToolContext,
    ToolError,
    ToolLost,
)
from dex_celery.engine import tracing
from dex_celery.integrations.mcp.client import MCP_DEFAULT_HINTS, McpServer, McpToolFunction
from dex_celery.model.ids import CallKey
from dex_celery.model.policy import EffectSource, resolve_policy
from tests.support.apps.span_file import SPANS_ENV, read_spans
from tests.support.faults.crash import tool_messages, wait_finished
from tests.support.mcp.server import _listening
from tests.support.mcp.tools_app import URL_ENV, make_app
from tests.support.processes.workers import each_stopped, mcp_worker

pytestmark = pytest.mark.crash


@pytest.fixture
def mcp_env(env: dict[str, str], tmp_path: Path) -> dict[str, str]:
    folder = tmp_path / "mcp-log"
    folder.mkdir()
    return {**env, LOG_ENV: str(folder), "PYTHONPATH": str(ROOT)}


def _build(mcp_env: dict[str, str], monkeypatch: pytest.MonkeyPatch) -> Dex:
    for name, value in mcp_env.items():
        monkeypatch.setenv(name, value)
    _app, dex = make_app(Settings.from_env(mcp_env))
    dex.store.create_schema()
    return dex


@pytest.fixture
def mcp_dex(mcp_env: dict[str, str], monkeypatch: pytest.MonkeyPatch) -> Dex:
    return _build(mcp_env, monkeypatch)


@pytest.fixture
def start_mcp_worker(mcp_env: dict[str, str]) -> Iterator[Callable[..., CeleryWorker]]:
    def start(extra_env: dict[str, str] | None = None, concurrency: int = 2) -> CeleryWorker:
        return mcp_worker({**mcp_env, **(extra_env or {})}, concurrency=concurrency)

    yield from each_stopped(start)


@pytest.fixture
def http_server(mcp_env: dict[str, str]) -> Iterator[tuple[str, subprocess.Popen[bytes]]]:
    """The same MCP server over streamable HTTP, on a free port."""
    yield from _served_over_http(mcp_env)


@pytest.fixture
def stateful_http_server(mcp_env: dict[str, str]) -> Iterator[tuple[str, subprocess.Popen[bytes]]]:
    """The same server over streamable HTTP with sessions, noting each session a client ends."""
    yield from _served_over_http(mcp_env, "--stateful")


def _served_over_http(
    mcp_env: dict[str, str], *extra: str
) -> Iterator[tuple[str, subprocess.Popen[bytes]]]:
    port = free_port()
    process = subprocess.Popen(
        [sys.executable, "-m", "devtools.mcp_tools_server", "--http", str(port), *extra],
        cwd=ROOT,
        env={**os.environ, **mcp_env},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    wait_for(lambda: _listening(port), timeout=30, what="the MCP HTTP server to listen")
    yield f"http://127.0.0.1:{port}/mcp", process
    process.kill()
    process.wait(timeout=10)


def _effect(dex: Dex, name: str, default: EffectClass | None = None) -> tuple[str, str]:
    tool = dex.get_tool(name)
    snapshot = resolve_policy(tool.policy, tool.annotations, default, dex.settings)
    return snapshot.effect.value, snapshot.effect_source.value


def _holding(mcp_env: dict[str, str], tool: str) -> list[int]:
    return [int(p.read_text()) for p in Path(mcp_env[LOG_ENV]).glob(f"holding-{tool}-*")]


def test_effect_classes_follow_annotations_with_mcp_defaults_and_policies_override(
    mcp_dex: Dex,
) -> None:
    """S1.4: annotations decide the class, missing hints read with MCP's defaults; a policy given
    to `add_mcp_server` beats them; metadata beats the session default."""
    meta, policy = EffectSource.TOOL_METADATA.value, EffectSource.POLICY.value
    assert _effect(mcp_dex, "lookup") == ("read", meta)  # readOnlyHint
    assert _effect(mcp_dex, "add_note") == ("non_idempotent_write", meta)  # additive, no idempotent
    assert _effect(mcp_dex, "cancel") == ("non_idempotent_write", meta)  # destructive
    assert _effect(mcp_dex, "bare") == ("non_idempotent_write", meta)  # no annotations at all
    assert _effect(mcp_dex, "slow_lookup") == ("read", meta)
    # Overrides: an idempotent-annotated tool declared a non-idempotent write, a title-only one
    # declared a read.
    assert _effect(mcp_dex, "set_status") == ("non_idempotent_write", policy)
    assert _effect(mcp_dex, "titled") == ("read", policy)
    # A policy without an effect leaves the class to the annotations.
    assert _effect(mcp_dex, "slow_cancel") == ("non_idempotent_write", meta)
    # MCP's defaults are framework metadata, so they beat a session default (S1.4).
    assert _effect(mcp_dex, "bare", EffectClass.READ) == ("non_idempotent_write", meta)
    assert dict(mcp_dex.get_tool("bare").annotations) == dict(MCP_DEFAULT_HINTS)
    # Approval defaults follow the class (S1.3): writes ask, unless the policy says no.
    cancel = mcp_dex.get_tool("cancel")
    assert resolve_policy(
        cancel.policy, cancel.annotations, None, mcp_dex.settings
    ).requires_approval
    # The input schema is the server's.
    assert mcp_dex.get_tool("lookup").input_schema is not None
    assert mcp_dex.get_tool("lookup").input_schema["required"] == ["order_id"]


def test_registration_errors_register_nothing(mcp_dex: Dex, mcp_env: dict[str, str]) -> None:
    """Registering connects to nothing; bad registrations are `ConfigurationError`s, raised when
    the list is first registered (or at once with `required=True`), before any tool is added."""
    mcp_dex.get_tool("lookup")  # the app's own server ("orders") registers its tools
    before = set(mcp_dex.tools)
    command = f"{sys.executable} -m devtools.mcp_tools_server"  # a string is split
    env = {"PYTHONPATH": str(ROOT), LOG_ENV: mcp_env[LOG_ENV]}
    bad = mcp_dex.add_mcp_server(
        "a", command=command, env=env, prefix="a_", policies={"nope": None}
    )
    with pytest.raises(ConfigurationError, match="no tool named 'nope'"):
        bad.tools()
    same = mcp_dex.add_mcp_server("b", command=command, env=env)  # same names, no prefix
    with pytest.raises(ConfigurationError, match="'lookup' is registered already"):
        same.tools()
    with pytest.raises(ConfigurationError, match="named 'b' is registered already"):
        mcp_dex.add_mcp_server("b", command=command, env=env)
    dead = f"http://127.0.0.1:{free_port()}/mcp"
    with pytest.raises(ConfigurationError, match="cannot list the tools"):
        mcp_dex.add_mcp_server("down", url=dead, required=True)
    # Not required (the default): one unreachable server registers nothing and breaks nothing;
    # asking for its tools is the typed error naming it.
    down = mcp_dex.add_mcp_server("down2", url=dead, connect_timeout=5)
    with pytest.raises(McpServerUnavailable, match="'down2'") as raised:
        down.tools()
    assert raised.value.server == "down2"
    assert set(mcp_dex.tools) == before
    # A prefix keeps a second copy apart; `tools=` keeps only the named ones.
    added = mcp_dex.add_mcp_server("c", command=command, env=env, prefix="c_", tools=["lookup"])
    assert [t.name for t in added.tools()] == ["c_lookup"]
    assert "'c'" in (added.tools()[0].function.__doc__ or "")


def test_calls_run_on_a_worker_and_the_server_sees_the_key(
    mcp_dex: Dex, start_mcp_worker: Callable[..., CeleryWorker]
) -> None:
    start_mcp_worker()
    client = mcp_dex.client()
    # Arguments that break the server's input schema are refused at the request: nothing recorded.
    with pytest.raises(InvalidArguments, match="order_id"):
        client.request_call("s1", "t1", "bad", "lookup", {"order": "A"})
    assert mcp_dex.store.get_call("s1/t1/bad") is None

    read = client.request_call("s1", "t1", "c1", "lookup", {"order_id": "A-1"})
    write = client.request_call("s1", "t1", "c2", "cancel", {"order_id": "A-1"})
    assert write.status is CallStatus.AWAITING_APPROVAL  # destructive: asks a person (S1.3)
    client.approve(write.key, "ops@example.com")
    done_read, done_write = client.wait([read.key, write.key], timeout=60)

    assert done_read.status is CallStatus.SUCCEEDED, done_read
    assert done_read.result == '{"order_id": "A-1", "status": "open"}'
    assert done_write.status is CallStatus.SUCCEEDED, done_write
    assert sorted((t, k) for t, _, k in calls()) == [("cancel", write.key), ("lookup", read.key)]


def test_server_killed_mid_call_write_is_unknown_and_read_is_retried(
    mcp_dex: Dex, mcp_env: dict[str, str], start_mcp_worker: Callable[..., CeleryWorker]
) -> None:
    """A destructive tool whose server dies mid-call ends `outcome_unknown` after one attempt and
    never runs again; a read-only one is retried on a fresh server with the same key (S4.3)."""
    worker = start_mcp_worker()
    client = mcp_dex.client()

    write = client.request_call("s1", "t1", "w", "slow_cancel", {})
    wait_for(lambda: _holding(mcp_env, "slow_cancel"), timeout=60, what="slow_cancel to start")
    os.kill(_holding(mcp_env, "slow_cancel")[0], signal.SIGKILL)
    done = wait_finished(mcp_dex, write.key, timeout=60)
    assert done.status is CallStatus.OUTCOME_UNKNOWN, done
    assert done.attempts == 1
    assert "may or may not have run" in (done.error or "")
    (message,) = tool_messages(mcp_dex, write.key)
    assert OUTCOME_UNKNOWN_TOOL_RESULT in message

    read = client.request_call("s1", "t1", "r", "slow_lookup", {})
    wait_for(lambda: _holding(mcp_env, "slow_lookup"), timeout=60, what="slow_lookup to start")
    os.kill(_holding(mcp_env, "slow_lookup")[0], signal.SIGKILL)
    (Path(mcp_env[LOG_ENV]) / "release").write_text("go")  # attempt 2 answers at once
    done_read = wait_finished(mcp_dex, read.key, timeout=60)
    assert done_read.status is CallStatus.SUCCEEDED, done_read
    assert done_read.attempts == 2
    assert done_read.result == '{"result": "looked up"}'

    log = calls()
    assert [k for t, _, k in log if t == "slow_cancel"] == [write.key]  # never run again
    reads = [(p, k) for t, p, k in log if t == "slow_lookup"]
    assert [k for _, k in reads] == [read.key, read.key]  # same key on both attempts
    assert reads[0][0] != reads[1][0]  # on two server processes
    assert not worker.died()


def test_server_down_is_retryable_and_reported_as_did_not_run(
    mcp_env: dict[str, str],
    monkeypatch: pytest.MonkeyPatch,
    http_server: tuple[str, subprocess.Popen[bytes]],
    start_mcp_worker: Callable[..., CeleryWorker],
) -> None:
    """Streamable HTTP: the tools are listed from the running server; once it is down, a read is
    retried up to its attempt limit and a write gets its one attempt; both end `failed` with the
    did-not-run text, and the server saw nothing."""
    url, process = http_server
    mcp_env = {**mcp_env, URL_ENV: url}
    dex = _build(mcp_env, monkeypatch)
    start_mcp_worker({URL_ENV: url})
    client = dex.client()
    first = client.request_call("s1", "t1", "up", "lookup", {"order_id": "A"})
    assert client.wait([first.key], timeout=60)[0].status is CallStatus.SUCCEEDED
    assert [k for _, _, k in calls()] == [first.key]

    process.kill()
    process.wait(timeout=10)
    read = client.request_call("s1", "t1", "r", "lookup", {"order_id": "A"})
    write = client.request_call("s1", "t1", "w", "bare", {"value": 1})
    done_read, done_write = client.wait([read.key, write.key], timeout=60)
    assert done_read.status is CallStatus.FAILED
    assert done_read.attempts == dex.settings.max_attempts
    assert done_write.status is CallStatus.FAILED
    assert done_write.attempts == 1
    for done in (done_read, done_write):
        assert (done.error or "").startswith(DID_NOT_RUN), done.error
    assert [k for _, _, k in calls()] == [first.key]


def test_call_past_start_to_close_is_timed_out_not_lost(
    mcp_env: dict[str, str],
    monkeypatch: pytest.MonkeyPatch,
    start_mcp_worker: Callable[..., CeleryWorker],
) -> None:
    """Celery's soft time limit fires while the worker waits on the MCP server: the attempt is
    timed out (S5.1), so the write is `failed` with the time-out text, not `outcome_unknown`."""
    # Long enough for a stdio server to start and take the call on a loaded machine.
    short = {"DEX_START_TO_CLOSE": "6"}
    dex = _build({**mcp_env, **short}, monkeypatch)
    start_mcp_worker(short)
    record = dex.client().request_call("s1", "t1", "w", "slow_cancel", {})
    done = wait_finished(dex, record.key, timeout=60)
    assert done.status is CallStatus.FAILED, done
    assert "start-to-close timeout" in (done.error or ""), done.error
    assert [k for t, _, k in calls() if t == "slow_cancel"] == [record.key]


def test_tool_body_maps_answers_and_faults(mcp_env: dict[str, str]) -> None:
    """The worker's tool body, called directly: a server's refusal is a tool error (the call is
    `failed`), an unreachable server a retryable did-not-run error."""
    ctx = ToolContext(CallKey.of("s", "t", "c"), 1)
    server = McpServer(
        "orders",
        command=(sys.executable, "-m", "devtools.mcp_tools_server"),
        env={"PYTHONPATH": str(ROOT), LOG_ENV: mcp_env[LOG_ENV]},
    )
    with pytest.raises(ToolError) as refused:
        McpToolFunction(server, "no_such_tool")(ctx)
    assert not isinstance(refused.value, ToolLost | RetryableToolError)
    with pytest.raises(ToolError, match=r"validation error|order_id"):
        McpToolFunction(server, "lookup")(ctx)  # arguments the server refuses
    down = McpServer("down", url=f"http://127.0.0.1:{free_port()}/mcp", connect_timeout=5)
    assert "secret-token" not in repr(
        McpServer("h", url="http://h/mcp", headers={"a": "secret-token"})
    )
    with pytest.raises(RetryableToolError, match=f"^{DID_NOT_RUN}"):
        McpToolFunction(down, "lookup")(ctx, order_id="A")
    assert McpToolFunction(server, "lookup")(ctx, order_id="A") == {
        "order_id": "A",
        "status": "open",
    }


def test_a_tool_added_on_the_server_is_picked_up_by_processes_started_later(
    mcp_dex: Dex,
    mcp_env: dict[str, str],
    monkeypatch: pytest.MonkeyPatch,
    start_mcp_worker: Callable[..., CeleryWorker],
) -> None:
    """A worker reads the tool list anew at start and keeps it in the database: a requester
    asking for the new tool finds it there (no server process of its own)."""
    assert "added_later" not in mcp_dex.tools
    changed = {**mcp_env, EXTRA_TOOL_ENV: "1"}
    dex = _build(changed, monkeypatch)
    start_mcp_worker({EXTRA_TOOL_ENV: "1"})
    record = dex.client().request_call("s1", "t1", "new", "added_later", {})
    (done,) = dex.client().wait([record.key], timeout=60)
    assert done.status is CallStatus.SUCCEEDED, done
    assert done.result == '{"result": "new"}'


def test_http_headers_go_with_every_request(
    mcp_dex: Dex, http_server: tuple[str, subprocess.Popen[bytes]]
) -> None:
    """`headers=` (an Authorization header, say) reach the server on listing and on each call."""
    url, _process = http_server
    (tool,) = mcp_dex.add_mcp_server(
        url=url, headers={HEADER: "token-1"}, prefix="h_", tools=["lookup"]
    ).tools()
    ctx = ToolContext(CallKey.of("s", "t", "c"), 1)
    assert tool.function(ctx, order_id="A") == {"order_id": "A", "status": "open"}
    assert headers_seen() == ["token-1"]


# --- warm sessions (mcp/sessions) --------------------------------------------------------------


def _server_pids(tool: str) -> list[int]:
    return [p for t, p, _ in calls() if t == tool]


def _gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    # A killed child of a live parent stays a zombie until reaped: count it gone too.
    status = Path(f"/proc/{pid}/stat").read_text().split(") ", 1)[1][0]
    return status == "Z"


def test_one_server_process_serves_every_attempt_of_a_worker_process(
    mcp_dex: Dex, start_mcp_worker: Callable[..., CeleryWorker]
) -> None:
    """A worker process keeps one session per server: four calls in a row run on one server
    process, not one per attempt."""
    start_mcp_worker(concurrency=1)
    client = mcp_dex.client()
    for n in range(4):
        record = client.request_call("s1", "t1", f"c{n}", "lookup", {"order_id": str(n)})
        (done,) = client.wait([record.key], timeout=60)
        assert done.status is CallStatus.SUCCEEDED, done
    pids = _server_pids("lookup")
    assert len(pids) == 4
    assert len(set(pids)) == 1, pids


def test_a_server_that_died_between_calls_is_restarted_and_the_write_runs_once(
    mcp_dex: Dex, start_mcp_worker: Callable[..., CeleryWorker]
) -> None:
    """The warm session's server is killed while idle: the next attempt notices before sending
    (its ping fails), starts a new server and the write runs there, once, in one attempt (not
    `outcome_unknown`: nothing had been sent to the dead server)."""
    start_mcp_worker(concurrency=1)
    client = mcp_dex.client()
    first = client.request_call("s1", "t1", "r", "lookup", {"order_id": "A"})
    assert client.wait([first.key], timeout=60)[0].status is CallStatus.SUCCEEDED
    (old,) = _server_pids("lookup")
    os.kill(old, signal.SIGKILL)
    wait_for(lambda: _gone(old), timeout=30, what="the MCP server to die")

    write = client.request_call("s1", "t1", "w", "bare", {"value": 1})
    (done,) = client.wait([write.key], timeout=60)
    assert done.status is CallStatus.SUCCEEDED, done
    assert done.attempts == 1
    (new,) = [p for t, p, k in calls() if k == write.key]
    assert new != old


def test_worker_killed_mid_call_write_is_unknown_and_read_is_retried(
    mcp_dex: Dex, mcp_env: dict[str, str], start_mcp_worker: Callable[..., CeleryWorker]
) -> None:
    """SIGKILL of the worker's pool process while its warm session's server runs the tool: the
    write ends `outcome_unknown` after one attempt; the read is retried (same key) and answers."""
    worker = start_mcp_worker(concurrency=1)
    client = mcp_dex.client()

    write = client.request_call("s1", "t1", "w", "slow_cancel", {})
    wait_for(lambda: _holding(mcp_env, "slow_cancel"), timeout=60, what="slow_cancel to start")
    (child,) = worker.children()
    os.kill(child, signal.SIGKILL)
    done = wait_finished(mcp_dex, write.key, timeout=90)
    assert done.status is CallStatus.OUTCOME_UNKNOWN, done
    assert done.attempts == 1

    read = client.request_call("s1", "t1", "r", "slow_lookup", {})
    wait_for(lambda: _holding(mcp_env, "slow_lookup"), timeout=60, what="slow_lookup to start")
    wait_for(lambda: len(worker.children()) == 1, timeout=30, what="a new pool process")
    (child,) = worker.children()
    os.kill(child, signal.SIGKILL)
    (Path(mcp_env[LOG_ENV]) / "release").write_text("go")  # attempt 2 answers at once
    done_read = wait_finished(mcp_dex, read.key, timeout=90)
    assert done_read.status is CallStatus.SUCCEEDED, done_read
    assert done_read.attempts == 2
    assert [k for t, _, k in calls() if t == "slow_cancel"] == [write.key]
    assert [k for t, _, k in calls() if t == "slow_lookup"] == [read.key, read.key]


def test_a_warm_shutdown_closes_the_warm_sessions(
    mcp_env: dict[str, str],
    monkeypatch: pytest.MonkeyPatch,
    stateful_http_server: tuple[str, subprocess.Popen[bytes]],
    start_mcp_worker: Callable[..., CeleryWorker],
) -> None:
    """SIGTERM (a deploy): the pool process ends the warm session it kept for the server
    (`processes/worker.py`), so the server sees the session closed (its `DELETE`) instead of a
    client that vanished. The session is still open between calls: only the shutdown ends it."""
    url, _process = stateful_http_server
    dex = _build({**mcp_env, URL_ENV: url}, monkeypatch)
    worker = start_mcp_worker({URL_ENV: url}, concurrency=1)
    client = dex.client()
    for n in range(2):
        record = client.request_call("s1", "t1", f"c{n}", "lookup", {"order_id": str(n)})
        assert client.wait([record.key], timeout=60)[0].status is CallStatus.SUCCEEDED
    first, second = lookup_sessions()
    assert first == second  # one warm session served both calls
    assert first not in closed_sessions()

    os.kill(worker.pid, signal.SIGTERM)
    assert worker.process is not None
    assert worker.process.wait(timeout=60) == 0
    assert first in closed_sessions(), worker.log()


def test_a_third_party_server_from_pypi_runs_on_one_warm_session(mcp_dex: Dex) -> None:
    """`mcp-server-time` (PyPI, not written here): listed, classified from its own annotations
    when trusted, and called three times over one server process."""
    from dex_celery.integrations.mcp.sessions import pool

    tools = mcp_dex.add_mcp_server(
        "time",
        command=[sys.executable, "-m", "mcp_server_time", "--local-timezone", "UTC"],
        prefix="time_",
        trust="annotations",
    ).tools()
    assert {t.name for t in tools} >= {"time_get_current_time", "time_convert_time"}
    assert _effect(mcp_dex, "time_get_current_time")[0] == "read"
    body = mcp_dex.get_tool("time_get_current_time").function
    ctx = ToolContext(CallKey.of("s", "t", "c"), 1)
    before = pool().stats().opened.get("time", 0)
    for _ in range(3):
        answer = body(ctx, timezone="Europe/Paris")
        assert "Europe/Paris" in str(answer)
    assert pool().stats().opened.get("time", 0) == before + 1


def test_the_call_s_trace_reaches_the_mcp_server_in_the_request_s_meta(
    mcp_dex: Dex, mcp_env: dict[str, str], tmp_path: Path
) -> None:
    """The W3C trace context the 2026-07-28 revision carries in `_meta` (docs/mcp.md): the
    `tools/call` a worker sends continues the call's trace (the request span here, the attempt's
    span in the worker, the SDK's client span), so the server sees a `traceparent` of that
    trace whose parent is the worker's span of that call."""
    provider = TracerProvider()
    memory = InMemorySpanExporter()
    provider.add_span_processor(SimpleSpanProcessor(memory))
    tracing.configure(provider)
    spans_file = tmp_path / "worker-spans.jsonl"
    worker = mcp_worker(
        {**mcp_env, SPANS_ENV: str(spans_file)},
        module="tests.support.mcp.traced_tools_app",
        concurrency=1,
    )
    try:
        record = mcp_dex.client().request_call("s1", "t1", "traced", "lookup", {"order_id": "A"})
        assert wait_finished(mcp_dex, record.key).status is CallStatus.SUCCEEDED
    finally:
        worker.stop()
        tracing.configure(None)
        provider.shutdown()

    (request,) = [s for s in memory.get_finished_spans() if s.name == tracing.REQUEST]
    assert request.context is not None
    trace_id = format(request.context.trace_id, "032x")
    _version, sent_trace, sent_parent, _flags = traceparents()[record.key].split("-")
    assert sent_trace == trace_id
    worker_spans = {s["span_id"]: s for s in read_spans(spans_file)}
    parent = worker_spans[sent_parent]  # a span the worker made, in the call's trace
    assert parent["trace_id"] == trace_id
    # The SDK's client span of the `tools/call`, inside the attempt's span for this call.
    assert parent["name"] == "MCP send tools/call lookup", parent
    attempt = worker_spans[parent["parent_span_id"]]
    assert attempt["attributes"]["dex.idempotency_key"] == record.key, attempt
