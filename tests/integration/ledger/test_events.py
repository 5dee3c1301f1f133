"""AgentEvents: read from a position, resume, follow live, trimmed by a setting (S7.3)."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable
from itertools import islice

from devtools.processes import Worker
from devtools.toolapp import make_app
from dex_celery import (
    AgentEvent,
    AsyncDexClient,
    CallRequest,
    CallStatus,
    Dex,
    EventType,
    Settings,
)

FINISHED = EventType.TOOL_CALL_FINISHED


def _turn(session: str, turn: str) -> list[CallRequest]:
    """Reads, a retried read and a failing write: several events per call, in several orders."""
    return [
        CallRequest(session, turn, "echo-1", "echo", {"n": 1}),
        CallRequest(session, turn, "echo-2", "echo", {"n": 2}),
        CallRequest(session, turn, "flaky", "flaky_read", {"fail_times": 1}),
        CallRequest(session, turn, "fails", "failing", {"message": "out of stock"}),
    ]


def _check_per_call_order(events: list[AgentEvent], dex: Dex) -> None:
    """Every call: requested, then its starts, then exactly one finished with its status."""
    keys = {e.key for e in events}
    for key in keys:
        mine = [e for e in events if e.key == key]
        kinds = [e.type for e in mine]
        assert kinds[0] is EventType.TOOL_CALL_REQUESTED, (key, kinds)
        assert kinds[-1] is FINISHED, (key, kinds)
        assert kinds.count(FINISHED) == 1, (key, kinds)
        starts = [e.attempt for e in mine if e.type is EventType.TOOL_CALL_STARTED]
        assert starts == sorted(starts) and starts, (key, starts)
        record = dex.store.get_call(key)
        assert record is not None and mine[-1].status is record.status
        assert (mine[-1].error or None) == record.error
        positions = [e.position for e in mine]
        assert positions == sorted(positions, key=lambda p: tuple(map(int, p.split("-"))))


def test_late_consumer_resumes_and_sees_each_finish_once(
    dex: Dex, start_worker: Callable[..., Worker]
) -> None:
    """S7.3: consumers that start late, stop, and resume from their saved position see every
    `tool_call_finished` exactly once, after the same call's requested and started events."""
    start_worker()
    client = dex.client()
    first = client.request_calls(_turn("ev", "t1"))
    client.wait([r.key for r in first], timeout=60)

    # A consumer that starts now (late) reads a few events, then stops and keeps its position.
    early = list(islice(client.events(after="0"), 5))
    assert len(early) == 5
    saved = early[-1].position

    # Meanwhile a follower starts from "now" and watches the second turn live.
    start = dex.events.latest_position()
    live: list[AgentEvent] = []

    def follow() -> None:
        for event in client.events(after=start, session_id="ev", follow=True, timeout=60):
            live.append(event)
            if sum(e.type is FINISHED for e in live) == 4:
                return

    follower = threading.Thread(target=follow, daemon=True)
    follower.start()
    second = client.request_calls(_turn("ev", "t2"))
    client.wait([r.key for r in second], timeout=60)
    follower.join(timeout=60)
    assert not follower.is_alive()

    # The first consumer resumes from its saved position.
    resumed = early + list(client.events(after=saved))
    everything = list(client.events(after="0"))
    assert [e.position for e in resumed] == [e.position for e in everything]
    assert len({e.position for e in resumed}) == len(resumed)  # nothing twice
    _check_per_call_order(everything, dex)
    finished = [e for e in everything if e.type is FINISHED]
    assert sorted(e.key for e in finished) == sorted(r.key for r in first + second)
    statuses = {e.tool_call_id: e.status for e in finished if e.turn_id == "t1"}
    assert statuses == {
        "echo-1": CallStatus.SUCCEEDED,
        "echo-2": CallStatus.SUCCEEDED,
        "flaky": CallStatus.SUCCEEDED,
        "fails": CallStatus.FAILED,
    }
    flaky_starts = [
        e.attempt for e in everything if e.key == "ev/t1/flaky" and e.type.endswith("started")
    ]
    assert flaky_starts == [1, 2]  # a retried read: two attempts, one finish

    assert {e.key for e in live if e.type is FINISHED} == {r.key for r in second}
    assert all(e.turn_id == "t2" for e in live)

    # An async consumer, started last, reads in two pieces and resumes between them.
    async def consume() -> list[AgentEvent]:
        aclient = AsyncDexClient(dex)
        got: list[AgentEvent] = []
        async for event in aclient.events(after="0", types={FINISHED}):
            got.append(event)
            if len(got) == 3:
                break
        async for event in aclient.events(after=got[-1].position, types={FINISHED}):
            got.append(event)
        return got

    async_finished = asyncio.run(consume())
    assert [e.position for e in async_finished] == [e.position for e in finished]
    # Nothing was trimmed under the default limit, so no consumer can have missed anything.
    assert not dex.events.trimmed_after("0")


def test_stream_is_trimmed_by_the_events_maxlen_setting(env: dict[str, str]) -> None:
    """S7.3 (the approximate length limit is a setting): with `events_maxlen=10` the stream
    stays far below the number of events written, and a consumer can tell it fell behind."""
    _app, dex = make_app(Settings.from_env(env, events_maxlen=10))
    dex.store.create_schema()
    events = dex.events
    assert events.maxlen == 10
    dex.client().request_calls([CallRequest("trim", "t", f"c{i}", "echo", {}) for i in range(400)])
    assert events.length() < 400  # MAXLEN ~ trims whole stream nodes, so "about" 10
    oldest = next(iter(events.iterate(after="0")))
    assert events.trimmed_after("0-1")
    assert not events.trimmed_after(oldest.position)
