"""Approvals through MCP tasks (docs/mcp.md, "Approvals as input_required"): a call waiting for
a person is an `input_required` task carrying the approval's context; `tasks/update` decides it
for an identity with `approvals:decide` only (S11.3), with edited arguments under S13.3.3, and
the decision is the one-winner decision of the web app and the CLI (S6.3).

A real `dex-celery mcp` over streamable HTTP with tokens, the SDK's client, a real worker, the
web app signed in as a person, and the tool's own log counting runs.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable
from typing import Any

import anyio
import httpx
import pytest
from mcp.client.streamable_http import streamable_http_client
from mcp.shared._httpx_utils import create_mcp_http_client

from devtools.processes import Worker
from dex_celery import CallStatus, Dex
from dex_celery.integrations.mcp.outcome import OUTCOME_META_KEY
from dex_celery.integrations.mcp.tasks import (
    APPROVAL_INPUT,
    APPROVAL_META_KEY,
    DECISION_META_KEY,
)
from dex_celery.integrations.mcp.wire import IDEMPOTENCY_META_KEY
from dex_celery.web.app import WebApp
from tests.support.faults.crash import lines, wait_finished
from tests.support.mcp.server import _server
from tests.support.mcp.tasks_client import (
    CreatedTask,
    approve,
    call,
    get_task,
    tasks_client,
    update_task,
    wait_task,
)
from tests.support.web.web_session import CREDENTIALS, signed_in

#: `bot` may call tools only; `boss` may also decide approvals; `rival` calls tools only.
TOKENS = (
    "bot:bot-tok:tools:call,boss:boss-tok:tools:call+approvals:decide,rival:rival-tok:tools:call"
)


def as_(url: str, token: str) -> tuple[httpx.AsyncClient, Any]:
    http = create_mcp_http_client(headers={"Authorization": f"Bearer {token}"})
    return http, tasks_client(streamable_http_client(url, http_client=http))


def _error(e: BaseException) -> str:
    while isinstance(e, BaseExceptionGroup) and e.exceptions:
        e = e.exceptions[0]
    return f"{type(e).__name__}: {e}"


async def try_update(url: str, token: str, task_id: str, answer: dict[str, Any]) -> str:
    """`tasks/update` as `token`: the decision it reports, or the error it got."""
    http, client = as_(url, token)
    try:
        async with http, client as mcp:
            ack = await update_task(mcp, task_id, answer)
            return str((ack.meta or {}).get(DECISION_META_KEY))
    except Exception as e:  # the refusal, however the SDK reports it
        return _error(e)


def test_an_approver_decides_through_tasks_update_and_others_cannot(
    dex: Dex, env: dict[str, str], start_worker: Callable[..., Worker]
) -> None:
    start_worker()

    async def scenario(url: str) -> dict[str, Any]:
        seen: dict[str, Any] = {}
        http, client = as_(url, "bot-tok")
        async with http, client as mcp:
            created = await call(
                mcp, "guarded_write", {"value": "asked"}, meta={IDEMPOTENCY_META_KEY: "b/t1/w"}
            )
            assert isinstance(created, CreatedTask), created
            seen["created"] = created
            key = created.task_id  # the call's key in bot's namespace
            # bot may follow its task but not decide it: an error, and the call keeps waiting.
            seen["bot"] = await try_update(url, "bot-tok", key, approve())
            seen["waiting"] = await get_task(mcp, key)
            # rival neither sees it nor decides it.
            seen["rival"] = await try_update(url, "rival-tok", key, approve())
            # boss holds approvals:decide: approves by the call's key, with edited arguments.
            seen["boss"] = await try_update(
                url, "boss-tok", key, approve("smaller", json.dumps({"value": "edited"}))
            )
            seen["again"] = await try_update(url, "boss-tok", key, approve())
            seen["done"] = await wait_task(mcp, key)
        return seen

    with _server("http", {**env, "DEX_WEB_TOKENS": TOKENS}) as target:
        seen = anyio.run(scenario, target)

    created = seen["created"]
    key = created.task_id
    assert created.status == "input_required"
    waiting = seen["waiting"]
    assert waiting.status == "input_required"
    assert waiting.meta[OUTCOME_META_KEY] == "pending"
    context = waiting.meta[APPROVAL_META_KEY]
    assert context["tool"] == "guarded_write" and context["arguments"] == {"value": "asked"}
    form = waiting.model_extra["inputRequests"][APPROVAL_INPUT]  # type: ignore[index]
    assert form["method"] == "elicitation/create"
    assert "approvals:decide" in seen["bot"], seen
    assert "Task not found" in seen["rival"], seen
    assert seen["boss"] == "approved", seen
    assert "already approved by boss" in seen["again"], seen

    done = seen["done"]
    assert done.status == "completed", done
    assert done.result["content"][0]["text"].endswith('"edited"')  # type: ignore[index]
    assert done.meta[OUTCOME_META_KEY] == "executed"
    record = dex.client().get_call(key)
    assert record.approval is not None and record.approval.decided_by == "boss"
    assert record.approval_edit is not None
    assert len(lines(key, "start")) == 1  # ran once


@pytest.mark.parametrize("round_", range(3))
def test_racing_the_web_app_exactly_one_decision_stands(
    round_: int, dex: Dex, env: dict[str, str], start_worker: Callable[..., Worker]
) -> None:
    start_worker()
    web = signed_in(WebApp(dex, CREDENTIALS), "alice", "pw-a")
    page = web.get("/approvals").text
    csrf = page.split('name="csrf" value="', 1)[1].split('"', 1)[0]
    results: dict[str, Any] = {}
    barrier = threading.Barrier(2)

    def web_rejects(key: str) -> None:
        barrier.wait()
        form = {"key": key, "action": "reject", "note": "web says no", "csrf": csrf}
        results["web"] = web.post("/approvals/decide", data=form).status_code

    async def scenario(url: str) -> str:
        http, client = as_(url, "boss-tok")
        async with http, client as mcp:
            created = await call(
                mcp, "guarded_write", {"value": "race"}, meta={IDEMPOTENCY_META_KEY: "r/t1/w"}
            )
            assert isinstance(created, CreatedTask), created
        key = created.task_id
        thread = threading.Thread(target=web_rejects, args=(key,))
        thread.start()
        await anyio.to_thread.run_sync(barrier.wait)
        results["mcp"] = await try_update(url, "boss-tok", key, approve())
        await anyio.to_thread.run_sync(thread.join, 30)
        return key

    with _server("http", {**env, "DEX_WEB_TOKENS": TOKENS}) as target:
        key = anyio.run(scenario, target)

    record = dex.client().get_call(key)
    assert record.approval is not None
    mcp_won, web_won = results["mcp"] == "approved", results["web"] == 303
    assert mcp_won != web_won, results  # exactly one decision stands
    if mcp_won:
        assert results["web"] == 409
        assert record.approval.decided_by == "boss"
        assert wait_finished(dex, key).status is CallStatus.SUCCEEDED
        assert len(lines(key, "start")) == 1
    else:
        assert "already rejected by alice" in results["mcp"], results
        assert record.status is CallStatus.REJECTED
        assert lines(key, "start") == []
