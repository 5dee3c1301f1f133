"""`dex-celery mcp` implements the outcome extension (docs/mcp-outcome-extension.md), driven by
the official `mcp` SDK's client declaring it: a real server process over streamable HTTP, real
prefork workers SIGKILLed mid-write, the sweeper, and the tool's own log.

- The server advertises `dex-celery/outcome` in `server/discover`.
- A worker killed while the write runs gives `unknown` (S4.3, S4.5), to the waiting request and
  to the key sent again: never `not_executed`.
- A call refused before any worker took it (rejected by a person, S6.2; bad arguments, S9.3)
  gives `not_executed`.
- An opaque key (no `/`) is one call too: sent twice, recorded once.
- The MCP Inspector's CLI sends the key (`--tool-metadata`, the command of the extension's
  doc) and reads the outcome.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import subprocess
import threading
from collections.abc import Callable
from typing import Any

import anyio
import pytest
from mcp import Client
from mcp.client.extension import advertise

from devtools.processes import ROOT, Worker
from dex_celery import CallStatus, Dex
from dex_celery.integrations.mcp.outcome import (
    OUTCOME_EXTENSION,
    OUTCOME_EXTENSION_VERSION,
    OUTCOME_META_KEY,
    STATUS_META_KEY,
)
from dex_celery.integrations.mcp.wire import IDEMPOTENCY_META_KEY
from tests.support.faults.crash import lines, wait_started
from tests.support.mcp.server import _server, _text

pytestmark = pytest.mark.crash


def outcome_client(target: Any) -> Client:
    """The SDK's client declaring the extension on every request."""
    return Client(target, extensions=[advertise(OUTCOME_EXTENSION)])


def test_the_server_advertises_the_extension(dex: Dex, env: dict[str, str]) -> None:
    async def discover(target: Any) -> dict[str, Any]:
        async with outcome_client(target) as mcp:
            return dict(mcp.server_capabilities.extensions or {})

    with _server("http", env) as target:
        extensions = anyio.run(discover, target)
    settings = extensions[OUTCOME_EXTENSION]
    assert settings["version"] == OUTCOME_EXTENSION_VERSION
    assert set(settings["outcomes"]) == {"executed", "not_executed", "unknown", "pending"}


def test_sigkill_of_the_worker_mid_write_gives_unknown_never_not_executed(
    dex: Dex,
    env: dict[str, str],
    start_worker: Callable[..., Worker],
    sweeper: threading.Event,
) -> None:
    doomed = start_worker(concurrency=1)
    key = "kill/t1/write"
    meta = {IDEMPOTENCY_META_KEY: key}

    async def scenario(target: Any) -> tuple[Any, Any]:
        answers: list[Any] = []

        async def first() -> None:
            async with outcome_client(target) as mcp:
                answers.append(
                    await mcp.call_tool("slow_non_idempotent_write", {"seconds": 60}, meta=meta)
                )

        async with anyio.create_task_group() as tg:
            tg.start_soon(first)
            await anyio.to_thread.run_sync(lambda: wait_started(key))
            doomed.kill_all()  # SIGKILL mid-write: the write may or may not have happened
        async with outcome_client(target) as mcp:  # the key sent again
            again = await mcp.call_tool("slow_non_idempotent_write", {"seconds": 60}, meta=meta)
        return answers[0], again

    with _server("http", env) as target:
        first, again = anyio.run(scenario, target)

    assert dex.client().get_call(key).status is CallStatus.OUTCOME_UNKNOWN
    for answer in (first, again):
        assert answer.meta[OUTCOME_META_KEY] == "unknown", _text(answer)
        assert answer.meta[STATUS_META_KEY] == "outcome_unknown"
        assert answer.meta[IDEMPOTENCY_META_KEY] == key
        assert answer.is_error
    assert len(lines(key, "start")) == 1 and lines(key, "end") == []


def test_a_call_refused_before_any_worker_took_it_gives_not_executed(
    dex: Dex, env: dict[str, str], start_worker: Callable[..., Worker]
) -> None:
    start_worker()
    key = "refused/t1/write"
    meta = {IDEMPOTENCY_META_KEY: key}

    async def scenario(target: Any) -> dict[str, Any]:
        seen: dict[str, Any] = {}
        async with outcome_client(target) as mcp:
            seen["waiting"] = await mcp.call_tool("guarded_write", {"value": "x"}, meta=meta)
            await anyio.to_thread.run_sync(
                lambda: dex.client().reject(key, "ops@example.com", "not today")
            )
            seen["rejected"] = await mcp.call_tool("guarded_write", {"value": "x"}, meta=meta)
            seen["bad"] = await mcp.call_tool(
                "guarded_write", {"nope": 1}, meta={IDEMPOTENCY_META_KEY: "refused/t1/bad"}
            )
        return seen

    with _server("http", env) as target:
        seen = anyio.run(scenario, target)

    assert seen["waiting"].meta[OUTCOME_META_KEY] == "pending"
    assert seen["rejected"].meta[OUTCOME_META_KEY] == "not_executed"
    assert seen["rejected"].meta[STATUS_META_KEY] == "rejected"
    assert seen["bad"].meta[OUTCOME_META_KEY] == "not_executed"
    assert seen["bad"].meta[STATUS_META_KEY] == "refused"
    assert lines(key, "start") == []


def test_an_opaque_key_is_one_call(
    dex: Dex, env: dict[str, str], start_worker: Callable[..., Worker]
) -> None:
    start_worker()
    meta = {IDEMPOTENCY_META_KEY: "3f0c1a52-9d7e-4b7e-9a51-0c1d2e3f4a5b"}

    async def scenario(target: Any) -> tuple[Any, Any]:
        async with outcome_client(target) as mcp:
            first = await mcp.call_tool("guarded_write", {"value": "o"}, meta=meta)
        async with outcome_client(target) as mcp:
            again = await mcp.call_tool("guarded_write", {"value": "o"}, meta=meta)
        return first, again

    with _server("http", env) as target:
        first, again = anyio.run(scenario, target)
    key = first.meta[IDEMPOTENCY_META_KEY]
    assert again.meta[IDEMPOTENCY_META_KEY] == key
    assert key.split("/")[1] == "key"
    assert [c.key for c in dex.client().pending_approvals()] == [key]


@pytest.mark.skipif(shutil.which("npx") is None, reason="npx (Node.js) is missing")
def test_the_inspector_sends_the_key_and_reads_the_outcome(
    dex: Dex, env: dict[str, str], start_worker: Callable[..., Worker]
) -> None:
    """The command of the extension's doc, twice: one call, one run, both answers `executed`."""
    start_worker()
    doc = (ROOT / "docs" / "mcp-outcome-extension.md").read_text()
    (command,) = [shlex.split(c) for c in re.findall(r"^npx .*$", doc, re.MULTILINE)]
    key = "desk/t1/charge-7"

    def inspector(url: str) -> dict[str, Any]:
        names = {"charge": "slow_non_idempotent_write", "amount=7": "seconds=0"}
        argv = [url if a.startswith("http://127.0.0.1:8000") else names.get(a, a) for a in command]
        done = subprocess.run(
            argv, cwd=ROOT, env={**os.environ, **env}, capture_output=True, text=True, timeout=300
        )
        assert done.returncode == 0 and done.stdout.startswith("{"), (done.stdout, done.stderr)
        return dict(json.loads(done.stdout))

    with _server("http", env) as target:
        answers = [inspector(str(target)) for _ in range(2)]
    for answer in answers:
        assert answer["_meta"][OUTCOME_META_KEY] == "executed", answer
        assert answer["_meta"][IDEMPOTENCY_META_KEY] == key
    assert dex.client().get_call(key).status is CallStatus.SUCCEEDED
    assert len(lines(key, "start")) == 1
