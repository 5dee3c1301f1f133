"""`dex-celery mcp` serves calls as MCP tasks (the 2026-07-28 tasks extension, docs/mcp.md) to a
client that declares the extension, over stdio and streamable HTTP: the `mcp` SDK's client, a
real `dex-celery mcp` process, a real worker, approvals decided through the CLI, and the tool's
own log counting executions."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Callable
from typing import Any

import anyio
import pytest
from mcp import Client
from mcp.client.streamable_http import streamable_http_client
from mcp.shared._httpx_utils import create_mcp_http_client

from devtools.processes import ROOT, Worker
from dex_celery import CallStatus, Dex
from dex_celery.access import Identity, local_identity
from dex_celery.integrations.mcp.namespace import namespace_of
from dex_celery.integrations.mcp.outcome import OUTCOME_META_KEY, STATUS_META_KEY
from dex_celery.integrations.mcp.server import TOOLS_LIST_TTL_MS
from dex_celery.integrations.mcp.tasks import CANCEL_META_KEY, DEADLINE_META_KEY
from dex_celery.integrations.mcp.wire import IDEMPOTENCY_META_KEY
from tests.support.faults.crash import lines, wait_finished, wait_started
from tests.support.mcp.server import DEX_CELERY, _server
from tests.support.mcp.tasks_client import (
    CreatedTask,
    call,
    cancel_task,
    get_task,
    tasks_client,
    wait_task,
)


def approve_with_cli(env: dict[str, str], key: str, who: str) -> None:
    """`dex-celery -A APP approvals approve KEY --by WHO`, as an operator types it."""
    done = subprocess.run(
        [DEX_CELERY, "-A", "devtools.toolapp:dex", "approvals", "approve", key, "--by", who],
        cwd=ROOT,
        env={**os.environ, **env, "PYTHONPATH": str(ROOT)},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr


@pytest.mark.parametrize("transport", ["stdio", "http"])
def test_a_write_needing_approval_is_a_task_that_completes_once_approved_and_runs_once(
    transport: str, dex: Dex, env: dict[str, str], start_worker: Callable[..., Worker]
) -> None:
    start_worker()
    key = f"s-task-{transport}/t1/write"

    async def scenario(target: Any) -> dict[str, Any]:
        seen: dict[str, Any] = {}
        async with tasks_client(target) as mcp:
            created = await call(
                mcp, "guarded_write", {"value": "ok"}, meta={IDEMPOTENCY_META_KEY: key}
            )
            seen["created"] = created
            seen["waiting"] = await get_task(mcp, key)
            # Asked again (a re-send with a new JSON-RPC id): the same task, the same call.
            seen["again"] = await call(
                mcp, "guarded_write", {"value": "ok"}, meta={IDEMPOTENCY_META_KEY: key}
            )
            await anyio.to_thread.run_sync(approve_with_cli, env, key, "ops@example.com")
            seen["done"] = await wait_task(mcp, key)
            seen["cancel_after"] = await cancel_task(mcp, key)
        return seen

    with _server(transport, env) as target:
        seen = anyio.run(scenario, target)

    created = seen["created"]
    assert isinstance(created, CreatedTask), created
    assert created.task_id == key and created.status == "input_required"
    waiting = seen["waiting"]
    assert waiting.status == "input_required"
    assert "waiting for a person's approval until" in (waiting.status_message or "")
    assert waiting.meta[STATUS_META_KEY] == "awaiting_approval"
    assert waiting.meta[OUTCOME_META_KEY] == "pending"
    assert waiting.meta[DEADLINE_META_KEY].endswith("Z")
    assert isinstance(seen["again"], CreatedTask) and seen["again"].task_id == key

    done = seen["done"]
    assert done.status == "completed", done
    assert done.result is not None
    assert done.result["content"][0]["text"] == '"ok"'
    assert done.result["isError"] is False
    assert done.result["_meta"][OUTCOME_META_KEY] == "executed"
    assert done.result["_meta"][IDEMPOTENCY_META_KEY] == key
    assert done.meta[OUTCOME_META_KEY] == "executed"
    assert seen["cancel_after"].meta[CANCEL_META_KEY] == "already_ended"
    assert len(lines(key, "start")) == 1
    assert dex.client().get_call(key).approval.decided_by == "ops@example.com"  # type: ignore[union-attr]


@pytest.mark.parametrize("transport", ["stdio", "http"])
def test_cancelling_a_task_waiting_for_approval_rejects_the_call(
    transport: str, dex: Dex, env: dict[str, str], start_worker: Callable[..., Worker]
) -> None:
    start_worker()

    async def scenario(target: Any) -> dict[str, Any]:
        seen: dict[str, Any] = {}
        async with tasks_client(target) as mcp:
            # No ids: the server names the call, and the task id is its key.
            created = await call(mcp, "guarded_write", {"value": "cancel-me"})
            assert isinstance(created, CreatedTask), created
            seen["created"] = created
            seen["cancel"] = await cancel_task(mcp, created.task_id)
            seen["state"] = await get_task(mcp, created.task_id)
            # Its outcome was given: the same request without ids is a new call.
            seen["next"] = await call(mcp, "guarded_write", {"value": "cancel-me"})
        return seen

    with _server(transport, env) as target:
        seen = anyio.run(scenario, target)

    key = seen["created"].task_id
    assert seen["cancel"].meta[CANCEL_META_KEY] == "rejected"
    state = seen["state"]
    assert state.status == "cancelled"
    assert state.meta[STATUS_META_KEY] == "rejected"
    assert state.meta[OUTCOME_META_KEY] == "not_executed"
    record = dex.client().get_call(key)
    assert record.status is CallStatus.REJECTED
    # Who cancelled it: the caller as the server knows it (no credentials: the OS user).
    assert record.approval is not None
    assert record.approval.decided_by == local_identity().name
    assert "tasks/cancel" in (record.approval.note or record.error or "")
    assert lines(key, "start") == []
    assert seen["next"].task_id != key


def test_a_task_whose_worker_is_killed_mid_call_ends_with_the_unknown_outcome(
    dex: Dex,
    env: dict[str, str],
    start_worker: Callable[..., Worker],
    sweeper: Any,
) -> None:
    worker = start_worker()
    key = "s-task-kill/t1/write"

    async def scenario(target: Any) -> dict[str, Any]:
        seen: dict[str, Any] = {}
        async with tasks_client(target) as mcp:
            seen["created"] = await call(
                mcp, "slow_non_idempotent_write", {"seconds": 60}, {IDEMPOTENCY_META_KEY: key}
            )
            await anyio.to_thread.run_sync(lambda: wait_started(key))
            seen["running"] = await get_task(mcp, key)
            seen["cancel"] = await cancel_task(mcp, key)
            worker.kill_all()
            seen["done"] = await wait_task(mcp, key, timeout=60)
        return seen

    with _server("http", env) as target:
        seen = anyio.run(scenario, target)

    assert isinstance(seen["created"], CreatedTask)
    assert seen["running"].status == "working"
    assert seen["running"].meta[STATUS_META_KEY] == "pending"
    # Running, and where: the worker the ledger names for the attempt.
    assert (seen["running"].status_message or "").startswith("running on "), seen["running"]
    assert "(attempt 1)" in (seen["running"].status_message or "")
    # A running call cannot be taken back: the answer says it may still take effect.
    assert seen["cancel"].meta[CANCEL_META_KEY] == "may_still_run"
    done = seen["done"]
    assert done.status == "completed"
    assert done.result is not None and done.result["isError"] is True
    assert done.result["_meta"][OUTCOME_META_KEY] == "unknown"
    assert done.meta[STATUS_META_KEY] == "outcome_unknown"
    assert wait_finished(dex, key).status is CallStatus.OUTCOME_UNKNOWN
    assert [a for a, _, _ in lines(key, "start")] == [1]


TOKENS = "agent:agent-tok:tools:call,rival:rival-tok:tools:call"


def test_a_task_of_another_token_is_neither_readable_nor_cancellable(
    dex: Dex, env: dict[str, str], start_worker: Callable[..., Worker]
) -> None:
    """A task id is not a capability (docs/security.md): `tasks/get` and `tasks/cancel` pass the
    same door as `tools/call` (no token: 401), and another identity naming the task gets the
    same "not found" as for an id that does not exist; the call still waits, untouched."""
    start_worker()
    key = "agent-session/t1/charge"
    # The call as the ledger holds it: in the agent's namespace (docs/security.md).
    owned = f"{namespace_of(Identity('agent', via='token'))}:{key}"

    def as_(url: str, token: str | None) -> Any:
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        http = create_mcp_http_client(headers=headers)
        return http, tasks_client(streamable_http_client(url, http_client=http))

    async def refused(url: str, token: str | None, task_id: str, method: str) -> str:
        http, client = as_(url, token)
        try:
            async with http, client as mcp:
                if method == "get":
                    await get_task(mcp, task_id)
                else:
                    await cancel_task(mcp, task_id)
        except BaseException as e:  # the refusal, however the SDK reports it
            while isinstance(e, BaseExceptionGroup) and e.exceptions:
                e = e.exceptions[0]
            return f"{type(e).__name__}: {e}"
        return "answered"

    async def scenario(url: str) -> dict[str, Any]:
        seen: dict[str, Any] = {}
        http, client = as_(url, "agent-tok")
        async with http, client as mcp:
            seen["created"] = await call(
                mcp, "guarded_write", {"value": "x"}, meta={IDEMPOTENCY_META_KEY: key}
            )
            seen["own"] = await get_task(mcp, key)
        for method in ("get", "cancel"):
            seen[f"rival_{method}"] = await refused(url, "rival-tok", owned, method)
            seen[f"rival_{method}_bare"] = await refused(url, "rival-tok", key, method)
            seen[f"rival_{method}_none"] = await refused(
                url, "rival-tok", "agent-session/t1/nothing", method
            )
        seen["anonymous"] = await refused(url, None, key, "get")
        return seen

    with _server("http", {**env, "DEX_WEB_TOKENS": TOKENS}) as target:
        seen = anyio.run(scenario, target)

    assert isinstance(seen["created"], CreatedTask)
    assert seen["own"].status == "input_required"
    for method in ("get", "cancel"):
        assert "Task not found" in seen[f"rival_{method}"], seen
        # The same answer whether or not the task exists.
        assert seen[f"rival_{method}"] == seen[f"rival_{method}_none"]
        assert seen[f"rival_{method}"] == seen[f"rival_{method}_bare"]
    assert "401" in seen["anonymous"] or "authentication" in seen["anonymous"], seen
    record = dex.client().get_call(owned)
    assert record.status is CallStatus.AWAITING_APPROVAL
    assert lines(owned, "start") == []


@pytest.mark.parametrize("mode", ["legacy", "modern_without_tasks"])
def test_clients_that_do_not_speak_tasks_get_todays_answers(
    mode: str, dex: Dex, env: dict[str, str], start_worker: Callable[..., Worker]
) -> None:
    """An older revision's client (the `initialize` handshake) and a 2026-07-28 client that does
    not declare the extension: a call waiting for approval answers at once with that fact, the
    outcome field saying `pending`; after approval, asking again gives the outcome."""
    start_worker()
    key = f"s-plain-{mode}/t1/write"
    ids = {IDEMPOTENCY_META_KEY: key}

    async def scenario(target: Any) -> dict[str, Any]:
        seen: dict[str, Any] = {}
        client = Client(target, mode="legacy") if mode == "legacy" else Client(target)
        async with client as mcp:
            seen["version"] = mcp.protocol_version
            seen["tools"] = await mcp.list_tools()
            seen["pending"] = await mcp.call_tool("guarded_write", {"value": "v"}, meta=ids)
            await anyio.to_thread.run_sync(approve_with_cli, env, key, "ops@example.com")
            seen["done"] = await mcp.call_tool("guarded_write", {"value": "v"}, meta=ids)
        return seen

    with _server("http", env) as target:
        seen = anyio.run(scenario, target)

    assert (seen["version"] == "2026-07-28") is (mode != "legacy")
    # The newest revision's list caching: how long the client may keep the tool list.
    expected_ttl = 0 if mode == "legacy" else TOOLS_LIST_TTL_MS  # 0: an older wire has none
    assert seen["tools"].ttl_ms == expected_ttl
    pending, done = seen["pending"], seen["done"]
    assert pending.is_error and pending.meta[STATUS_META_KEY] == "awaiting_approval"
    assert pending.meta[OUTCOME_META_KEY] == "pending"
    assert not done.is_error and done.meta[OUTCOME_META_KEY] == "executed"
    assert len(lines(key, "start")) == 1
