"""Hypothesis fuzz of every door's bad input (S9.3), against real redis-server, SQLite and
PostgreSQL, a real prefork worker and real `dex-celery` processes: deep nesting, lone
surrogates, NUL, integers beyond 64 bits, NaN and infinities, odd Python types, unicode and
separators in session/turn/call ids, very long strings (`tests/support/inputs/fuzz.py`).

Whatever comes in, each door answers in its own typed way: the Python API (`DexClient`,
`AsyncDexClient`) raises a `DexError`; the CLI prints one `error:` line and exits 1; the MCP
server answers a tool error (or, for a request its JSON-RPC layer cannot parse, a JSON-RPC
error); the web app a 4xx page. A refused input leaves every SQL row, ledger hash, index and
the events stream as they were, and afterwards the worker still serves a normal call.

The budget is the `fuzz` Hypothesis profile (tests/conftest.py): a fixed number of examples
per door and no deadline, so the whole file stays bounded in CI.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import uuid
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any
from urllib.parse import quote, urlencode

import httpx
import pytest
import redis
from click.testing import CliRunner
from hypothesis import given
from hypothesis import strategies as st
from starlette.testclient import TestClient

from devtools.processes import ROOT, Worker
from devtools.toolapp import LOG_ENV
from dex_celery import CallStatus, Dex
from dex_celery.cli.main import main
from dex_celery.client.dex_client import AsyncDexClient
from dex_celery.errors import DexError, InvalidDecision
from dex_celery.integrations.frameworks.calls import Decision, Decisions
from dex_celery.integrations.mcp.server import SESSION_META_KEY, TOOL_CALL_META_KEY, TURN_META_KEY
from dex_celery.integrations.mcp.wire import IDEMPOTENCY_META_KEY
from dex_celery.web.app import WebApp
from tests.support.apps import cliapp
from tests.support.inputs.bad_input import state
from tests.support.inputs.fuzz import (
    fuzz_settings,
    hostile_text,
    ids,
    json_texts,
    odd_values,
    requests,
    valid_ids,
    wire_values,
)
from tests.support.mcp.server import DEX_CELERY, _server
from tests.support.stores.databases import ON_BOTH_DATABASES
from tests.support.web.web_session import CREDENTIALS, signed_in

pytestmark = pytest.mark.filterwarnings("ignore::celery.exceptions.DuplicateTaskNameWarning")

#: Tool names as a caller might send them: real ones, hostile text, not text at all.
tool_names = st.one_of(
    st.sampled_from(["echo", "guarded_write"]), hostile_text, st.none(), st.integers()
)


def _served_after(dex: Dex, start_worker: Callable[..., Worker]) -> None:
    """The worker keeps serving: a normal call after the fuzz succeeds."""
    start_worker()
    client = dex.client()
    normal = client.request_call("after-fuzz", "t1", "c1", "echo", {"x": 1})
    (done,) = client.wait([normal.key], timeout=90)
    assert done.status is CallStatus.SUCCEEDED, done


@ON_BOTH_DATABASES
def test_fuzzed_requests_and_decisions_through_the_python_api(
    dex: Dex, env: dict[str, str], start_worker: Callable[..., Worker]
) -> None:
    client = dex.client()
    r = redis.Redis.from_url(env["DEX_REDIS_URL"], decode_responses=True)
    log_dir = Path(env[LOG_ENV])
    seen: Counter[str] = Counter()

    @fuzz_settings()
    @given(parts=requests(("echo", "guarded_write")), use_async=st.booleans())
    def request(parts: dict[str, Any], use_async: bool) -> None:
        args = (parts["session"], parts["turn"], parts["call"], parts["tool"], parts["arguments"])
        before = state(dex, r, log_dir)
        try:
            if use_async:
                record = asyncio.run(AsyncDexClient(dex).request_call(*args))
            else:
                record = client.request_call(*args)
        except DexError:
            assert state(dex, r, log_dir) == before  # nothing stored half-way
            seen["refused"] += 1
            return
        seen["recorded"] += 1
        assert client.get_call(record.key).arguments == record.arguments

    @fuzz_settings()
    @given(
        key=st.one_of(st.none(), st.none(), ids),
        approver=st.one_of(valid_ids, valid_ids, ids, hostile_text),
        note=st.one_of(st.none(), st.text(max_size=30), hostile_text, odd_values),
        action=st.sampled_from(["approve", "reject"]),
    )
    def decide(key: Any, approver: Any, note: Any, action: str) -> None:
        # A call of its own waits for each decision (None: decide that one).
        if key is None:
            key = client.request_call("s1", "t1", uuid.uuid4().hex, "guarded_write", {}).key
        before = state(dex, r, log_dir)
        try:
            getattr(client, action)(key, approver, note)
        except DexError:
            assert state(dex, r, log_dir) == before
            seen["decision refused"] += 1
            return
        seen["decided"] += 1

    request()
    decide()
    assert min(seen[k] for k in ("refused", "recorded", "decision refused", "decided")) > 0, seen
    _served_after(dex, start_worker)


# --- the MCP server ------------------------------------------------------------------------------

#: What a 2026-07-28 client sends in each request's `_meta` (stateless: no `initialize`).
PROTOCOL_META = (
    '"io.modelcontextprotocol/protocolVersion":"2026-07-28",'
    '"io.modelcontextprotocol/clientCapabilities":{},'
    '"io.modelcontextprotocol/clientInfo":{"name":"fuzz","version":"1"}'
)
ACCEPT = {"Accept": "application/json, text/event-stream", "Content-Type": "application/json"}


def _rpc(url: str, tool: str, arguments: str, ids: dict[str, Any]) -> tuple[int, dict[str, Any]]:
    """One `tools/call` as raw JSON-RPC text (what a client could put on the wire, including
    what no encoder would write), and the answer's status and message."""
    id_meta = "".join(f",{json.dumps(k)}:{json.dumps(v)}" for k, v in ids.items())
    body = (
        '{"jsonrpc":"2.0","id":7,"method":"tools/call","params":{"name":' + json.dumps(tool)
        + ',"arguments":' + arguments + ',"_meta":{' + PROTOCOL_META + id_meta + "}}}"
    )  # fmt: skip
    answer = httpx.post(url, content=body.encode(), headers=ACCEPT, timeout=60)
    text = answer.text
    if text.startswith("event:") or "\ndata: " in text or text.startswith("data: "):
        text = next(line[6:] for line in text.splitlines() if line.startswith("data: "))
    return answer.status_code, json.loads(text)


def test_fuzzed_tools_calls_through_the_mcp_server(
    dex: Dex, env: dict[str, str], start_worker: Callable[..., Worker]
) -> None:
    r = redis.Redis.from_url(env["DEX_REDIS_URL"], decode_responses=True)
    log_dir = Path(env[LOG_ENV])
    seen: Counter[str] = Counter()
    with _server("http", env) as url:

        @fuzz_settings()
        @given(
            value=json_texts,
            whole=st.booleans(),
            tool=st.one_of(st.just("guarded_write"), hostile_text.filter(_encodable)),
            given_ids=st.one_of(
                st.just({}),
                st.fixed_dictionaries(
                    {
                        SESSION_META_KEY: ids.filter(_encodable),
                        TURN_META_KEY: valid_ids,
                        TOOL_CALL_META_KEY: st.uuids().map(lambda u: u.hex),
                    }
                ),
                st.fixed_dictionaries({IDEMPOTENCY_META_KEY: ids.filter(_encodable)}),
            ),
        )
        def call(value: str, whole: bool, tool: str, given_ids: dict[str, Any]) -> None:
            before = state(dex, r, log_dir)
            arguments = value if whole else '{"value":' + value + "}"
            status, message = _rpc(url, tool, arguments, given_ids)
            if "error" in message:
                # Not JSON the server could parse (400), or `params` that are not a
                # `tools/call`'s (arguments not an object): a JSON-RPC error, never a crash.
                assert status in (200, 400), (status, message)
                assert message["error"]["code"] in (-32700, -32600, -32602), message
                assert state(dex, r, log_dir) == before
                seen["protocol error"] += 1
                return
            assert status == 200, message
            result = message["result"]
            answered = result["_meta"]["dex-celery/status"]
            if answered == "refused":
                assert result["isError"] and result["content"][0]["text"].startswith("error: ")
                assert state(dex, r, log_dir) == before
                seen["tool error"] += 1
            else:
                assert answered == "awaiting_approval", result
                seen["recorded"] += 1

        call()
        assert min(seen[k] for k in ("protocol error", "tool error", "recorded")) > 0, seen
        # The server and the worker keep serving: a normal call through the same server.
        start_worker()
        status, message = _rpc(url, "echo", '{"x":1}', {IDEMPOTENCY_META_KEY: "after/t1/c1"})
        assert status == 200 and message["result"]["isError"] is False, message


def _encodable(text: Any) -> bool:
    """Text `json.dumps` writes as JSON (the generator's names and ids; values go raw)."""
    return not isinstance(text, str) or len(text) < 10_000


# --- the web app ---------------------------------------------------------------------------------


FORM = {"Content-Type": "application/x-www-form-urlencoded"}


def _sendable(text: str) -> str:
    """`text` as a browser could send it: UTF-8 (a lone surrogate becomes `?`), not endless."""
    return text.encode("utf-8", "replace").decode()[:5_000]


def _csrf(client: TestClient) -> str:
    return client.get("/approvals").text.split('name="csrf" value="', 1)[1].split('"', 1)[0]


@ON_BOTH_DATABASES
def test_fuzzed_web_forms_and_queries_get_4xx_pages(
    dex: Dex, env: dict[str, str], start_worker: Callable[..., Worker]
) -> None:
    r = redis.Redis.from_url(env["DEX_REDIS_URL"], decode_responses=True)
    log_dir = Path(env[LOG_ENV])
    client = dex.client()
    alice = signed_in(WebApp(dex, CREDENTIALS), "alice", "pw-a")
    token = _csrf(alice)
    seen: Counter[str] = Counter()
    # What a browser can send is bytes: text that has no UTF-8 (a lone surrogate) goes in as
    # raw percent-escapes below (`raw`), the rest as text.
    texts = hostile_text.map(_sendable)
    query_values = st.one_of(valid_ids, texts, st.integers().map(str))

    @fuzz_settings()
    @given(
        query=st.dictionaries(
            st.sampled_from(["session", "tool", "status", "since", "until", "limit", "full"]),
            query_values,
            max_size=4,
        ),
        key=st.one_of(st.none(), st.none(), ids.map(lambda v: _sendable(str(v)))),
        note=st.one_of(st.none(), texts),
        action=st.one_of(st.sampled_from(["approve", "reject"]), texts),
        session=query_values,
        raw=st.sampled_from(["", "%ff", "%ED%A0%80", "%00", "%C0%AF", "%"]),
    )
    def browse(
        query: dict[str, str], key: Any, note: Any, action: str, session: str, raw: str
    ) -> None:
        for path in ("/calls", "/approvals", "/unknowns"):
            page = alice.get(f"{path}?{urlencode(query)}&session={raw}&note={raw}")
            assert page.status_code in (200, 400), (path, query, raw, page.status_code)
        if key is None:
            key = client.request_call("s1", "t1", uuid.uuid4().hex, "guarded_write", {}).key
        page = alice.get(f"/calls/{quote(str(key), safe='/')}")
        assert page.status_code in (200, 404), (key, page.status_code)
        before = state(dex, r, log_dir)
        form = {
            "csrf": token,
            "key": str(key),
            "action": action,
            **({"note": note} if note else {}),
        }
        body = urlencode(form) + (f"&note={raw}" if raw else "")
        decided = alice.post("/approvals/decide", content=body, headers=FORM)
        if decided.status_code == 303:
            seen["decided"] += 1
        else:
            assert decided.status_code in (400, 409), (decided.status_code, decided.text[-300:])
            assert state(dex, r, log_dir) == before
            seen["refused"] += 1
        body = urlencode({"csrf": token, "session": session}) + (f"&session={raw}" if raw else "")
        reconciled = alice.post("/unknowns/reconcile", content=body, headers=FORM)
        assert reconciled.status_code in (303, 400), reconciled.status_code

    browse()
    assert seen["decided"] > 0 and seen["refused"] > 0, seen
    _served_after(dex, start_worker)


# --- the CLI -------------------------------------------------------------------------------------


def test_fuzzed_cli_arguments_get_one_error_line(
    dex: Dex, env: dict[str, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    r = redis.Redis.from_url(env["DEX_REDIS_URL"], decode_responses=True)
    log_dir = Path(env[LOG_ENV])
    monkeypatch.setattr(cliapp, "dex", dex)
    client = dex.client()
    seen: Counter[str] = Counter()
    words = st.one_of(valid_ids, ids.filter(lambda v: isinstance(v, str) and "\x00" not in v))

    @fuzz_settings()
    @given(
        command=st.sampled_from(["show", "approve", "reject", "list", "pending"]),
        key=st.one_of(st.none(), st.none(), words),
        by=st.one_of(valid_ids, valid_ids, words),
        note=st.one_of(valid_ids, words),
        option=st.sampled_from(["--session", "--since", "--before", "--limit", "--status"]),
    )
    def run(command: str, key: Any, by: str, note: str, option: str) -> None:
        if key is None:
            key = client.request_call("s1", "t1", uuid.uuid4().hex, "guarded_write", {}).key
        args = {
            "show": ["calls", "show", key],
            "approve": ["approvals", "approve", key, "--by", by, "--note", note],
            "reject": ["approvals", "reject", key, "--by", by, "--note", note],
            "list": ["calls", "list", option, by],
            "pending": ["approvals", "list", "--limit", by],
        }[command]
        before = state(dex, r, log_dir)
        result = CliRunner().invoke(main, ["--app", "tests.support.apps.cliapp:dex", *args])
        assert result.exception is None or isinstance(result.exception, SystemExit), (
            args, result.exception,
        )  # fmt: skip
        assert "Traceback" not in result.output
        if result.exit_code == 1:
            lines = result.stderr.splitlines()
            assert len(lines) == 1 and lines[0].startswith("error: "), result.stderr
        else:
            assert result.exit_code in (0, 2), (args, result.exit_code, result.output)
        if result.exit_code != 0 or command in ("show", "list", "pending"):
            assert state(dex, r, log_dir) == before
        seen[str(result.exit_code)] += 1

    run()
    assert seen["0"] > 0 and seen["1"] > 0, seen


def test_cli_arguments_that_are_not_utf8_get_one_error_line(dex: Dex, env: dict[str, str]) -> None:
    """A real `dex-celery` process given bytes that are not UTF-8 on its command line (Python
    reads them as lone surrogates): one `error:` line, exit 1, nothing written."""
    r = redis.Redis.from_url(env["DEX_REDIS_URL"], decode_responses=True)
    before = state(dex, r, Path(env[LOG_ENV]))
    for args, says in (
        ([b"calls", b"show", b"s\xff/t1/c1"], b"control characters"),
        ([b"approvals", b"approve", b"s1/t1/c1", b"--by", b"b\xffob"], b"control characters"),
        ([b"calls", b"list", b"--session", b"s\xff"], b"control characters"),
        ([b"calls", b"list", b"--limit", b"99999999999999999999999"], b"limit"),
    ):
        done = subprocess.run(
            [DEX_CELERY.encode(), b"-A", b"devtools.toolapp:dex", *args],
            cwd=ROOT, env={**os.environ, **env, "PYTHONPATH": str(ROOT)},
            capture_output=True, timeout=120,
        )  # fmt: skip
        assert done.returncode == 1, (args, done.stderr)
        assert len(done.stderr.splitlines()) == 1 and done.stderr.startswith(b"error: "), done
        assert says in done.stderr, done.stderr
    assert state(dex, r, Path(env[LOG_ENV])) == before


# --- the framework adapters ------------------------------------------------------------------------


def test_fuzzed_framework_requests_and_resumes(dex: Dex, env: dict[str, str]) -> None:
    """What every adapter passes on (`frameworks.calls`): a model's ids and arguments give a
    record or the text the model reads, never an exception; a person's resume value is a
    `Decision` or `InvalidDecision`; a rejection's name and reason are taken or refused typed."""
    r = redis.Redis.from_url(env["DEX_REDIS_URL"], decode_responses=True)
    log_dir = Path(env[LOG_ENV])
    decisions = Decisions(dex, "fuzz")
    seen: Counter[str] = Counter()
    resume_values = st.one_of(
        st.booleans(),
        wire_values,
        odd_values,
        st.fixed_dictionaries(
            {},
            optional={
                "approved": st.one_of(st.booleans(), wire_values),
                "decided_by": st.one_of(valid_ids, ids, odd_values),
                "reason": st.one_of(hostile_text, odd_values),
                "type": st.one_of(st.sampled_from(["approve", "reject", "edit"]), hostile_text),
            },
        ),
    )

    @fuzz_settings()
    @given(parts=requests(("echo", "guarded_write")), use_async=st.booleans(), resume=resume_values)
    def model_and_person(parts: dict[str, Any], use_async: bool, resume: Any) -> None:
        args = (parts["session"], parts["turn"], parts["call"], parts["tool"], parts["arguments"])
        before = state(dex, r, log_dir)
        try:
            got = asyncio.run(decisions.arequest(*args)) if use_async else decisions.request(*args)
        except DexError:  # no such tool: adapters only offer registered ones; typed still
            assert state(dex, r, log_dir) == before
            seen["refused"] += 1
            return
        if isinstance(got, str):
            assert state(dex, r, log_dir) == before, got  # refused: the model reads why
            seen["model reads"] += 1
        else:
            seen["recorded"] += 1
        try:
            decision = Decision.parse(resume)
        except InvalidDecision:
            seen["resume refused"] += 1
            return
        if isinstance(got, str) or got.status is not CallStatus.AWAITING_APPROVAL:
            return
        before = state(dex, r, log_dir)
        try:
            decisions.reject(got, decision.decided_by or "", decision.reason)
        except DexError:
            assert state(dex, r, log_dir) == before
            seen["decision refused"] += 1
            return
        seen["decided"] += 1

    model_and_person()
    assert min(seen[k] for k in ("model reads", "recorded", "resume refused")) > 0, seen
