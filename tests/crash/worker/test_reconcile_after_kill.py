"""The seed's reconcile example against the real system after a real SIGKILL (S8.1-S8.3).

A prefork worker is killed (main process and pool children at once) while a
`non_idempotent_write` tool runs; the sweeper turns the lapsed lease into `outcome_unknown`
(S4.3). Reconciliation is then driven only through the interface the seed's
`report_unknown_outcomes` uses: an object with the two coroutines `get_agent_snapshot` and
`send_user_message`, messages read by `role`, `text`, `tool_output`, `turn_id`, `tool_call_id`
and `tool_arguments`, `MessageRole.USER` and `OUTCOME_UNKNOWN_TOOL_RESULT`. Two implementations
must pass the same checks: the library's `report_unknown_outcomes`, and the seed's function
itself, copied into `tests/support/apps/seed_example.py` with only its import line changed.
"""

from __future__ import annotations

import asyncio
import json
import threading
from collections.abc import Awaitable, Callable
from typing import Any

import pytest

from devtools.processes import Worker, wait_for
from devtools.toolapp import executions
from dex_celery import (
    OUTCOME_UNKNOWN_TOOL_RESULT,
    AgentSnapshot,
    AsyncDexClient,
    CallStatus,
    Dex,
    MessageRole,
    report_unknown_outcomes,
)
from tests.support.apps import seed_example

pytestmark = pytest.mark.crash

Reconciler = Callable[[Any, str, Callable[[str, str], Awaitable[str]]], Awaitable[list[str]]]


class Messenger:
    """Exactly the two coroutines the seed's `SessionMessenger` protocol names, and nothing
    else, so an implementation that reached for any other client call would fail here."""

    def __init__(self, client: AsyncDexClient) -> None:
        self._client = client
        self.sent: list[tuple[str, str]] = []

    async def get_agent_snapshot(self, session_id: str) -> AgentSnapshot:
        return await self._client.get_agent_snapshot(session_id)

    async def send_user_message(self, session_id: str, text: str) -> bool:
        delivered = await self._client.send_user_message(session_id, text)
        self.sent.append((session_id, text))
        return delivered


class OrderService:
    """Stands in for the service the tool wrote to: answers by idempotency key."""

    def __init__(self) -> None:
        self.asked: list[tuple[str, str]] = []

    async def check(self, key: str, arguments_json: str) -> str:
        self.asked.append((key, arguments_json))
        order = json.loads(arguments_json)["value"]["order"]
        return f"Note from the order system: order {order} was placed once."


def _unknown_after_kill(
    dex: Dex, start_worker: Callable[..., Worker], sessions: list[str]
) -> dict[str, str]:
    """One `slow_non_idempotent_write` call per session, all killed mid-run; returns keys."""
    worker = start_worker(concurrency=len(sessions))
    client = dex.client()
    keys = {}
    for number, session in enumerate(sessions, start=1001):
        record = client.request_call(
            session,
            "turn-1",
            "call-7",
            "slow_non_idempotent_write",
            {"seconds": 60, "value": {"order": number}},
        )
        keys[session] = record.key
    wait_for(
        lambda: all(executions(k) for k in keys.values()),
        timeout=60,
        what="every tool to start",
    )
    worker.kill_all()
    wait_for(
        lambda: all(
            (r := dex.store.get_call(k)) is not None and r.status is CallStatus.OUTCOME_UNKNOWN
            for k in keys.values()
        ),
        timeout=60,
        what="the killed calls to end outcome_unknown",
    )
    return keys


async def _drive(
    reconcile: Reconciler, messenger: Messenger, session: str, key: str, order: int
) -> str:
    """The checks both implementations must pass; returns the one report sent."""
    before = await messenger.get_agent_snapshot(session)
    (call,) = [c for c in before.tool_calls if c.key == key]
    assert call.status is CallStatus.OUTCOME_UNKNOWN  # S7.1
    assert call.error and "may or may not have taken effect" in call.error
    unknown = [m for m in before.messages if OUTCOME_UNKNOWN_TOOL_RESULT in (m.tool_output or "")]
    assert len(unknown) == 1  # S4.5: the history says so too
    message = unknown[0]
    assert message.role == MessageRole.TOOL
    assert f"{session}/{message.turn_id}/{message.tool_call_id}" == key  # S2.1, S8.1
    assert json.loads(message.tool_arguments or "") == {"seconds": 60, "value": {"order": order}}
    assert not [m for m in before.messages if m.role == MessageRole.USER]

    service = OrderService()
    reports = await reconcile(messenger, session, service.check)
    assert len(reports) == 1
    (report,) = reports
    assert service.asked == [(key, message.tool_arguments)]
    assert messenger.sent == [(session, report)]
    assert report.startswith(f"Note from the order system: order {order} was placed once")
    assert key in report

    after = await messenger.get_agent_snapshot(session)
    users = [m for m in after.messages if m.role == MessageRole.USER]
    assert [m.text for m in users] == [report]  # S7.4: appended as the user's words

    # S8.2: running the whole thing again sends nothing and does not even ask the service.
    assert await reconcile(messenger, session, service.check) == []
    assert messenger.sent == [(session, report)]
    assert len(service.asked) == 1
    return report


def test_seed_example_and_library_report_a_killed_write_once(
    dex: Dex, start_worker: Callable[..., Worker], sweeper: threading.Event
) -> None:
    """S8.1-S8.3 (and S4.3/S4.5 for the setup): a write killed mid-run is reported once, by
    the seed's unchanged function and by the library's, each through the seed's interface."""
    implementations: dict[str, Reconciler] = {
        "library": report_unknown_outcomes,
        "seed": seed_example.report_unknown_outcomes,
    }
    keys = _unknown_after_kill(dex, start_worker, [f"orders-{name}" for name in implementations])
    client = AsyncDexClient(dex)
    for order, (name, reconcile) in enumerate(implementations.items(), start=1001):
        session = f"orders-{name}"
        messenger = Messenger(client)
        report = asyncio.run(_drive(reconcile, messenger, session, keys[session], order))
        print(f"[{name}] send_user_message({session!r}, {report!r})")
        # The tool itself logged one start and no end: it ran once and was cut off (S3.2).
        assert [line.split()[0] for line in executions(keys[session])] == ["start"]

    # Each implementation also recognises the other's report: swapping them sends nothing.
    for name, other in (("library", "seed"), ("seed", "library")):
        messenger = Messenger(client)
        service = OrderService()
        sent = asyncio.run(implementations[name](messenger, f"orders-{other}", service.check))
        assert sent == [] and messenger.sent == [] and service.asked == []
