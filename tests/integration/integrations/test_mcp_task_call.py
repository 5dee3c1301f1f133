"""The public task helper (`dex_celery.integrations.mcp.task_call`, docs/mcp.md): the official
`mcp` SDK's client calls a dex tool as an MCP task, polls at `pollIntervalMs`, cancels, and
reads the outcome, against a real `dex-celery mcp` over streamable HTTP and a real worker."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import anyio
import pytest

from devtools.processes import Worker
from dex_celery import Dex, UnknownCall
from dex_celery.integrations.mcp.outcome import Outcome
from dex_celery.integrations.mcp.task_call import (
    call_as_task,
    cancel_task,
    get_task,
    task_client,
)
from tests.support.faults.crash import lines
from tests.support.mcp.server import _server


def test_create_poll_cancel_and_read_the_outcome(
    dex: Dex, env: dict[str, str], start_worker: Callable[..., Worker]
) -> None:
    start_worker()

    async def scenario(url: str) -> dict[str, Any]:
        seen: dict[str, Any] = {}
        async with task_client(url) as mcp:
            # Waits for a person: the helper gives up after `wait`, with no outcome yet.
            seen["waiting"] = await call_as_task(
                mcp, "guarded_write", {"value": "paid"}, key="helper/t1/w", wait=0.5
            )
            await anyio.to_thread.run_sync(
                lambda: dex.client().approve("helper/t1/w", "ops@example.com")
            )
            # The same key again is the same call: followed to its end.
            seen["done"] = await call_as_task(
                mcp, "guarded_write", {"value": "paid"}, key="helper/t1/w", wait=60
            )
            seen["other"] = await call_as_task(
                mcp, "guarded_write", {"value": "no"}, key="helper/t1/x", wait=0
            )
            seen["cancel"] = await cancel_task(mcp, "helper/t1/x")
            seen["cancelled"] = await get_task(mcp, "helper/t1/x")
            with pytest.raises(UnknownCall):
                await get_task(mcp, "helper/t1/none")
        return seen

    with _server("http", env) as target:
        seen = anyio.run(scenario, target)

    waiting = seen["waiting"]
    assert (waiting.status, waiting.outcome) == ("input_required", Outcome.PENDING)
    assert waiting.task_id == "helper/t1/w" and not waiting.ended
    done = seen["done"]
    # Ended within the server's `--task-after`: a plain result, or a completed task.
    assert done.ended and done.outcome is Outcome.EXECUTED
    assert done.status in ("completed", "result")
    assert done.result is not None and not done.result.is_error
    assert len(lines("helper/t1/w", "start")) == 1
    assert seen["cancel"]["_meta"]["dex-celery/cancel"] == "rejected"
    cancelled = seen["cancelled"]
    assert (cancelled.status, cancelled.outcome) == ("cancelled", Outcome.NOT_EXECUTED)
    assert lines("helper/t1/x", "start") == []
