"""Task status pushed (docs/mcp.md, "Task status pushed"): `subscriptions/listen` with
`tasksStatus` streams `notifications/tasks/status` for the caller's own tasks, each status
change once and in order, and nothing of another caller's tasks; polling `tasks/get` keeps
working. Two tokens against a real `dex-celery mcp` over streamable HTTP, the SDK's client, a
real worker, approvals decided in the test process.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import anyio
from mcp.client.streamable_http import streamable_http_client
from mcp.shared._httpx_utils import create_mcp_http_client

from devtools.processes import Worker, wait_for
from dex_celery import Dex
from dex_celery.integrations.mcp.outcome import OUTCOME_META_KEY
from dex_celery.integrations.mcp.tasks import SEQUENCE_META_KEY
from dex_celery.integrations.mcp.wire import IDEMPOTENCY_META_KEY
from tests.support.faults.crash import lines
from tests.support.mcp.server import _server
from tests.support.mcp.tasks_client import (
    CreatedTask,
    PushedStatus,
    call,
    get_task,
    listen_tasks,
    tasks_client,
)

TOKENS = "agent:agent-tok:tools:call,rival:rival-tok:tools:call"


def as_(url: str, token: str, pushed: list[PushedStatus]) -> tuple[Any, Any]:
    http = create_mcp_http_client(headers={"Authorization": f"Bearer {token}"})
    return http, tasks_client(streamable_http_client(url, http_client=http), pushed=pushed)


def test_a_subscribed_client_gets_each_status_of_its_own_tasks_once_and_in_order(
    dex: Dex, env: dict[str, str], start_worker: Callable[..., Worker]
) -> None:
    start_worker()
    pushed: dict[str, list[PushedStatus]] = {"agent": [], "rival": []}

    async def scenario(url: str) -> dict[str, Any]:
        seen: dict[str, Any] = {}
        keys: dict[str, str] = {}
        for who in ("agent", "rival"):
            http, client = as_(url, f"{who}-tok", [])
            async with http, client as mcp:
                created = await call(
                    mcp, "guarded_write", {"value": who}, meta={IDEMPOTENCY_META_KEY: "p/t1/w"}
                )
                assert isinstance(created, CreatedTask), created
                keys[who] = created.task_id
        seen["keys"] = keys

        async def listen(who: str, ids: list[str]) -> None:
            http, client = as_(url, f"{who}-tok", pushed[who])
            async with http, client as mcp:
                seen[f"{who}_end"] = await listen_tasks(mcp, ids)
                seen[f"{who}_polled"] = await get_task(mcp, keys[who])

        async with anyio.create_task_group() as tg:
            # agent also names rival's task (its full key) and one that does not exist.
            tg.start_soon(listen, "agent", [keys["agent"], keys["rival"], "p/t1/none"])
            tg.start_soon(listen, "rival", [keys["rival"]])
            for who in ("agent", "rival"):
                await anyio.to_thread.run_sync(
                    lambda w=who: wait_for(  # type: ignore[misc]
                        lambda: len(pushed[w]) >= 1, timeout=30, what=f"{w}'s first status"
                    )
                )
            for who in ("rival", "agent"):
                await anyio.to_thread.run_sync(
                    lambda w=who: dex.client().approve(keys[w], "ops@example.com")  # type: ignore[misc]
                )
        return seen

    with _server("http", {**env, "DEX_WEB_TOKENS": TOKENS}) as target:
        seen = anyio.run(scenario, target)

    keys = seen["keys"]
    for who in ("agent", "rival"):
        got = pushed[who]
        assert {p.task_id for p in got} == {keys[who]}, got  # nothing of the other's task
        assert [p.status for p in got] == ["input_required", "working", "completed"], got
        assert [p.meta[SEQUENCE_META_KEY] for p in got] == [1, 2, 3]
        assert got[-1].meta[OUTCOME_META_KEY] == "executed"
        assert seen[f"{who}_polled"].status == "completed"  # polling still works
        assert len(lines(keys[who], "start")) == 1
