"""How an ended remote task ends the attempt (docs/mcp.md, "Remote tools called as tasks"), and
when a task still going is cancelled: the table of `mcp/remote_task`, on the tasks a server of
the tasks extension sends (S4.2, S4.3, S4.5)."""

from __future__ import annotations

import time
from typing import Any, cast

import mcp_types
import pytest
from mcp import Client

from dex_celery.errors import RetryableToolError, ToolError, ToolLost
from dex_celery.integrations.mcp.client import McpServer, McpToolFunction
from dex_celery.integrations.mcp.outcome import OUTCOME_META_KEY, Outcome
from dex_celery.integrations.mcp.remote_task import CANCEL_MARGIN, RemoteTaskCall
from dex_celery.integrations.mcp.task_call import TaskOutcome
from dex_celery.model.ids import CallKey
from dex_celery.model.outcomes import DID_NOT_RUN
from dex_celery.tools.tool import ToolContext


def _call(*, states_outcome: bool = True, deadline: float | None = None) -> RemoteTaskCall:
    function = McpToolFunction(McpServer("far", url="http://127.0.0.1:9/mcp"), "charge")
    ctx = ToolContext(CallKey.of("s", "t", "c"), 1, deadline=deadline)
    meta = cast(mcp_types.RequestParamsMeta, {})
    return RemoteTaskCall(function, ctx, cast(Client, None), {}, meta, states_outcome)


def _task(
    status: str, outcome: Outcome | None, result: dict[str, Any] | None = None
) -> TaskOutcome:
    meta = {OUTCOME_META_KEY: outcome.value} if outcome else {}
    task = {"taskId": "s/t/c", "status": status, "statusMessage": "why", "_meta": meta}
    parsed = mcp_types.CallToolResult.model_validate(result) if result is not None else None
    return TaskOutcome("s/t/c", status, outcome or Outcome.PENDING, parsed, task)


_OK = {"content": [{"type": "text", "text": '{"charged": 7}'}]}
_ERROR = {"content": [{"type": "text", "text": "card declined"}], "isError": True}


def test_a_completed_task_gives_its_result_or_its_stated_outcome() -> None:
    assert _call()._ended(_task("completed", Outcome.EXECUTED, _OK)) == {"charged": 7}
    assert _call(states_outcome=False)._ended(_task("completed", None, _OK)) == {"charged": 7}
    with pytest.raises(ToolLost):
        _call()._ended(_task("completed", Outcome.UNKNOWN, _OK))
    with pytest.raises(ToolError, match="card declined"):
        _call()._ended(_task("completed", Outcome.EXECUTED, _ERROR))


def test_a_cancelled_task_did_not_run_only_if_the_server_says_so() -> None:
    with pytest.raises(ToolError) as did_not_run:
        _call()._ended(_task("cancelled", Outcome.NOT_EXECUTED))
    assert str(did_not_run.value.message).startswith(DID_NOT_RUN)
    assert not did_not_run.value.retryable  # the key names that cancelled task
    with pytest.raises(ToolLost):
        _call()._ended(_task("cancelled", None))
    with pytest.raises(ToolLost):  # a server without the outcome extension states nothing
        _call(states_outcome=False)._ended(_task("cancelled", Outcome.NOT_EXECUTED))


def test_a_failed_task_is_a_tool_error_unless_an_outcome_says_otherwise() -> None:
    with pytest.raises(RetryableToolError):
        _call()._ended(_task("failed", Outcome.NOT_EXECUTED))
    with pytest.raises(ToolLost):
        _call()._ended(_task("failed", Outcome.UNKNOWN))
    with pytest.raises(ToolError, match="card declined") as failed:
        _call(states_outcome=False)._ended(_task("failed", None, _ERROR))
    assert not isinstance(failed.value, ToolLost)


def test_a_task_still_going_is_cancelled_shortly_before_the_time_limit() -> None:
    assert _call().cancel_at is None  # no limit: followed until it ends or is fenced
    now = time.monotonic()
    long = _call(deadline=now + 60).cancel_at
    assert long is not None and abs(long - (now + 60 - CANCEL_MARGIN)) < 0.5
    short = _call(deadline=now + 4).cancel_at
    assert short is not None and abs(short - (now + 3)) < 0.5  # a quarter of the time left
