"""The bad-input suite (issue 6): bad inputs across the public API, the CLI and the wire each get
a typed error or are refused by a running worker and logged, and nothing is half-written (S9.3).

`tests/integration/bad_input/test_requests.py` covers request-time input case by case (unknown tool,
arguments that are not JSON / not an object / NaN / oversized, malformed ids, unknown effect
class, bad batches, bad user-message text, unknown session, duplicates). This suite does not
repeat those; it covers the other doors: approvals (S6.3), events positions (S7.3), lookups by
key, settings from the environment, the `dex-celery` CLI, and hand-crafted Celery messages
reaching a real prefork worker (S3.2, S3.3, S9.2).

"Nothing half-written" is checked by comparing, before and after each case: every SQL row, every
ledger hash under the test's prefix (its `refused` counter apart, which counts refused claims on
purpose), the deadline indexes, the events stream and the tools' own side-effect logs.
"""

from __future__ import annotations

import json
import pickle
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import cast

import pytest
import redis
from click.testing import CliRunner
from kombu import Connection, Queue

from devtools.processes import Worker, wait_for
from devtools.toolapp import LOG_ENV
from dex_celery import (
    CallStatus,
    Dex,
    InvalidId,
    Settings,
    UnknownCall,
)
from dex_celery.cli.main import main
from dex_celery.engine.request.dispatch import Dispatcher
from dex_celery.errors import (
    AlreadyDecided,
    ConfigurationError,
    DexError,
    InvalidDecision,
    InvalidEventPosition,
    NotAwaitingApproval,
    UnknownEffectClass,
    UnknownTool,
)
from tests.support.apps import cliapp
from tests.support.inputs.bad_input import state

pytestmark = pytest.mark.filterwarnings("ignore::celery.exceptions.DuplicateTaskNameWarning")

WAITING = "s1/t1/waiting"  # a guarded_write waiting for approval
PENDING = "s1/t1/pending"  # an echo call recorded and opened, never published
REJECTED = "s1/t1/rejected"  # a guarded_write a person rejected


def refused(dex: Dex, client: redis.Redis, key: str) -> int:
    return int(cast(str, client.hget(dex.keys.call(key), "refused") or 0))


@pytest.fixture
def world(dex: Dex, env: dict[str, str]) -> tuple[Dex, redis.Redis, Path]:
    """A waiting call, a pending (opened, unpublished) call and a rejected call."""
    client = dex.client()
    client.request_call("s1", "t1", "waiting", "guarded_write", {"value": 1})
    client.request_call("s1", "t1", "rejected", "guarded_write", {"value": 2})
    client.reject(REJECTED, "alice", "not today")
    # Recorded and opened like a real request, but never published: no worker can run it. (The
    # open publishes the message itself where the broker is the ledger's Redis: not here.)
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(Dispatcher, "_captured", lambda *a, **kw: None)
        patch.setattr(Dispatcher, "publish", lambda *a, **kw: None)
        client.request_call("s1", "t1", "pending", "echo", {"q": 1})
    r = redis.Redis.from_url(env["DEX_REDIS_URL"], decode_responses=True)
    return dex, r, Path(env[LOG_ENV])


# --- the public API and the settings ------------------------------------------------------------


@dataclass(frozen=True)
class ApiCase:
    id: str
    call: Callable[[Dex], object]
    error: type[Exception]
    #: Run first (its changes are allowed); the bad input is `call` after it.
    prepare: Callable[[Dex], object] | None = None


def _settings(**env: str) -> Callable[[Dex], object]:
    return lambda _dex: Settings.from_env(env)


API_CASES = [
    ApiCase("approve-unknown-call", lambda d: d.client().approve("s1/t1/nope", "bob"), UnknownCall),
    ApiCase("approve-malformed-key", lambda d: d.client().approve("not-a-key", "bob"), InvalidId),
    ApiCase("approve-key-with-4-parts", lambda d: d.client().approve("a/b/c/d", "b"), InvalidId),
    ApiCase("approve-empty-approver", lambda d: d.client().approve(WAITING, "  "), InvalidDecision),
    ApiCase(
        "approve-approver-control-char",
        lambda d: d.client().approve(WAITING, "bob\x07"),
        InvalidDecision,
    ),
    ApiCase(
        "approve-note-not-text",
        lambda d: d.client().approve(WAITING, "bob", cast(str, 42)),
        InvalidDecision,
    ),
    ApiCase(
        "reject-oversized-reason",
        lambda d: d.client().reject(WAITING, "bob", "x" * (64 * 1024 + 1)),
        InvalidDecision,
    ),
    ApiCase(
        "approve-call-that-needs-none",
        lambda d: d.client().approve(PENDING, "bob"),
        NotAwaitingApproval,
    ),
    ApiCase(
        "approve-a-rejected-call", lambda d: d.client().approve(REJECTED, "bob"), AlreadyDecided
    ),
    ApiCase(
        "reject-after-approve",
        lambda d: d.client().reject(WAITING, "carol"),
        AlreadyDecided,
        prepare=lambda d: d.client().approve(WAITING, "bob"),
    ),
    ApiCase(
        "pending-approvals-limit-0",
        lambda d: d.client().pending_approvals(limit=0),
        InvalidDecision,
    ),
    ApiCase("events-position-word", lambda d: list(d.client().events("abc")), InvalidEventPosition),
    ApiCase(
        "events-position-none",
        lambda d: list(d.client().events(cast(str, None))),
        InvalidEventPosition,
    ),
    ApiCase(
        "events-position-3-parts", lambda d: list(d.client().events("1-2-3")), InvalidEventPosition
    ),
    ApiCase("get-call-malformed-key", lambda d: d.client().get_call("a/b"), InvalidId),
    ApiCase("get-call-unknown", lambda d: d.client().get_call("s9/t9/c9"), UnknownCall),
    ApiCase("wait-unknown-call", lambda d: d.client().wait(["s9/t9/c9"], timeout=1), UnknownCall),
    ApiCase(
        "session-default-effect-not-text",
        lambda d: d.client().open_session("s2", default_effect=cast(str, 7)),
        UnknownEffectClass,
    ),
    ApiCase(
        "request-tool-name-not-text",
        lambda d: d.client().request_call("s1", "t2", "c1", cast(str, None), {}),
        UnknownTool,
    ),
    ApiCase(
        "env-heartbeat-not-a-number", _settings(DEX_HEARTBEAT_TIMEOUT="soon"), ConfigurationError
    ),
    ApiCase("env-sweep-interval-zero", _settings(DEX_SWEEP_INTERVAL="0"), ConfigurationError),
    ApiCase("env-max-attempts-fraction", _settings(DEX_MAX_ATTEMPTS="2.5"), ConfigurationError),
    ApiCase("env-finished-ttl-negative", _settings(DEX_FINISHED_TTL="-5"), ConfigurationError),
    ApiCase("env-key-prefix-with-braces", _settings(DEX_KEY_PREFIX="a{b}"), ConfigurationError),
    ApiCase("env-key-prefix-empty", _settings(DEX_KEY_PREFIX=""), ConfigurationError),
    ApiCase("env-record-wait-negative", _settings(DEX_RECORD_WAIT="-1"), ConfigurationError),
]


@pytest.mark.parametrize("case", API_CASES, ids=[c.id for c in API_CASES])
def test_bad_api_input_gets_a_typed_error_and_writes_nothing(
    world: tuple[Dex, redis.Redis, Path], case: ApiCase
) -> None:
    """S9.3 (and S6.3 for decisions, S7.3 for positions): a typed `DexError`; nothing changed."""
    dex, client, log_dir = world
    if case.prepare is not None:
        case.prepare(dex)
    before = state(dex, client, log_dir)
    with pytest.raises(case.error) as raised:
        case.call(dex)
    assert isinstance(raised.value, DexError)
    assert state(dex, client, log_dir) == before


# --- the CLI ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class CliCase:
    id: str
    args: tuple[str, ...]
    #: Words the message must contain (lower case).
    says: str
    app: str = "tests.support.apps.cliapp:dex"


CLI_CASES = [
    CliCase("app-module-missing", ("calls", "list"), "cannot import", app="no_such_mod_x:dex"),
    CliCase("app-not-a-dex", ("calls", "list"), "does not name", app="os:path"),
    CliCase(
        "app-attribute-missing", ("calls", "list"), "--app", app="tests.support.apps.cliapp:nothing"
    ),
    CliCase("calls-show-malformed-key", ("calls", "show", "not-a-key"), "key"),
    CliCase("calls-show-unknown-call", ("calls", "show", "s9/t9/c9"), "no tool call"),
    CliCase("calls-list-limit-0", ("calls", "list", "--limit", "0"), "limit"),
    CliCase("calls-list-unknown-status", ("calls", "list", "--status", "done"), "status"),
    CliCase("approve-without-approver", ("approvals", "approve", WAITING), "--by"),
    CliCase(
        "approve-a-pending-call", ("approvals", "approve", PENDING, "--by", "bob"), "never needed"
    ),
    CliCase("reject-a-rejected-call", ("approvals", "reject", REJECTED, "--by", "bob"), "reject"),
]


@pytest.mark.parametrize("case", CLI_CASES, ids=[c.id for c in CLI_CASES])
def test_bad_cli_input_exits_with_a_message_and_writes_nothing(
    world: tuple[Dex, redis.Redis, Path], case: CliCase, monkeypatch: pytest.MonkeyPatch
) -> None:
    """S9.3 through `dex-celery`: a non-zero exit with a message, no traceback, nothing written."""
    dex, client, log_dir = world
    monkeypatch.setattr(cliapp, "dex", dex)
    before = state(dex, client, log_dir)
    result = CliRunner().invoke(main, ["--app", case.app, *case.args])
    assert result.exit_code != 0, result.output
    assert isinstance(result.exception, SystemExit), result.exception
    assert "Traceback" not in result.output
    assert case.says in result.output.lower(), result.output
    assert state(dex, client, log_dir) == before


# --- the wire: hand-crafted messages to a running worker ---------------------------------------


def _publish_raw(url: str, body: bytes, content_type: str, task: str, task_id: str) -> None:
    headers = {
        "lang": "py",
        "task": task,
        "id": task_id,
        "root_id": task_id,
        "parent_id": None,
        "group": None,
        "argsrepr": "()",
        "kwargsrepr": "{}",
    }
    with Connection(url) as conn:
        conn.Producer().publish(
            body,
            routing_key="celery",
            exchange="",
            content_type=content_type,
            content_encoding="binary" if content_type.endswith("serialize") else "utf-8",
            headers=headers,
            declare=[Queue("celery")],
        )


def test_hand_crafted_messages_are_refused_by_a_real_worker(
    world: tuple[Dex, redis.Redis, Path],
    env: dict[str, str],
    start_worker: Callable[..., Worker],
) -> None:
    """S3.2, S3.3, S9.2, S9.3: a message the dispatcher did not send (missing field, forged
    attempt or key, unknown tool, replay of a finished attempt, pickle or garbage body) never
    runs tool code; the worker refuses it and logs why, and no record changes."""
    dex, client, log_dir = world
    worker = start_worker()
    # A real call that finishes, so its message can be replayed.
    done = dex.client().request_call("s1", "t1", "done", "echo", {"q": 2})
    (finished,) = dex.client().wait([done.key], timeout=30)
    assert finished.status is CallStatus.SUCCEEDED
    wait_for(lambda: len(list(log_dir.glob("s1__t1__done.log"))) == 1, timeout=10, what="log")
    url = env["DEX_REDIS_URL"]
    send = dex.celery.send_task

    def tid() -> str:
        return f"forged-{uuid.uuid4().hex[:8]}"

    cases: list[tuple[str, Callable[[str], object], str]] = [
        (
            "missing-field",
            lambda t: send("dex.tool.echo", kwargs={"key": PENDING, "arguments": {}}, task_id=t),
            "missing 1 required",
        ),
        (
            "forged-attempt",
            lambda t: send(
                "dex.tool.echo", kwargs={"key": PENDING, "attempt": 2, "arguments": {}}, task_id=t
            ),
            "claim refused (stale_attempt)",
        ),
        (
            "forged-unknown-key",
            lambda t: send(
                "dex.tool.echo",
                kwargs={"key": "s1/t1/forged", "attempt": 1, "arguments": {}},
                task_id=t,
            ),
            "claim refused (unknown)",
        ),
        (
            "forged-malformed-key",
            lambda t: send(
                "dex.tool.echo", kwargs={"key": "../etc", "attempt": 1, "arguments": {}}, task_id=t
            ),
            "InvalidId",
        ),
        (
            "unknown-tool",
            lambda t: send(
                "dex.tool.nope", kwargs={"key": PENDING, "attempt": 1, "arguments": {}}, task_id=t
            ),
            "unregistered task",
        ),
        (
            "replayed-finished-attempt",
            lambda t: send(
                "dex.tool.echo",
                kwargs={"key": done.key, "attempt": 1, "arguments": {"q": 2}},
                task_id=t,
            ),
            "claim refused (finished)",
        ),
        (
            "pickle-body",
            lambda t: _publish_raw(
                url,
                pickle.dumps(((), {"key": PENDING, "attempt": 1, "arguments": {}}, {})),
                "application/x-python-serialize",
                "dex.tool.echo",
                t,
            ),
            "pickle",
        ),
        (
            # Kombu's JSON decoder turns {"__type__", "__value__"} objects into Python values and
            # fails on an unknown type; the dispatcher sends arguments as JSON text so no real
            # message has one (issue 11). A forged one is dropped like any undecodable body.
            "unknown-type-marker",
            lambda t: _publish_raw(
                url,
                json.dumps(
                    [
                        [],
                        {
                            "key": PENDING,
                            "attempt": 1,
                            "arguments": {"q": {"__type__": "no-such-type", "__value__": 1}},
                        },
                        {},
                    ]
                ).encode(),
                "application/json",
                "dex.tool.echo",
                t,
            ),
            "decode",
        ),
        (
            "garbage-json-body",
            lambda t: _publish_raw(url, b"\x00{not json", "application/json", "dex.tool.echo", t),
            "decode",
        ),
    ]
    failures = []
    for name, publish, says in cases:
        before = state(dex, client, log_dir)
        refused_before = {k: refused(dex, client, k) for k in (PENDING, done.key)}
        task_id = tid()
        logged_before = worker.log().count(says)
        publish(task_id)
        try:
            wait_for(
                lambda s=says, n=logged_before: worker.log().count(s) > n,
                timeout=30,
                what=f"the worker to log {says!r} for {name}",
            )
        except AssertionError as e:
            failures.append(f"{name}: {e}\n{worker.log()[-1500:]}")
            continue
        if state(dex, client, log_dir) != before:
            failures.append(f"{name}: something was written")
        if (
            name == "forged-attempt"
            and refused(dex, client, PENDING) != refused_before[PENDING] + 1
        ):
            failures.append(f"{name}: the refused claim was not counted")
        if name == "replayed-finished-attempt" and (
            refused(dex, client, done.key) != refused_before[done.key] + 1
        ):
            failures.append(f"{name}: the refused claim was not counted")
    assert not failures, "\n".join(failures)
    # The tool itself ran once, for the real call only.
    assert [p.name for p in log_dir.glob("*.log") if not p.name.startswith("worker-")] == [
        "s1__t1__done.log"
    ]
    assert len((log_dir / "s1__t1__done.log").read_text().splitlines()) == 1
    assert json.loads(finished.result or "null")["arguments"] == {"q": 2}
