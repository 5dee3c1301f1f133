"""The client: what an agent loop, a support tool or a script talks to.

`DexClient` is synchronous, for Celery tasks and scripts; `AsyncDexClient` offers the same calls
as coroutines (the shape the seed's `report_unknown_outcomes` expects, S8.3) by running them in a
thread, since SQLAlchemy and redis-py calls here are short and blocking.
"""

from __future__ import annotations

import asyncio
import functools
import time
from collections.abc import AsyncIterator, Callable, Coroutine, Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Concatenate, ParamSpec, TypeVar, Unpack

from dex_celery.backend_errors import (
    backend_errors,
    translated_async_iterator,
    translated_iterator,
    translating_backend_errors,
)
from dex_celery.engine import CallRequest, PendingApproval, decided, decided_step
from dex_celery.errors import CallTimeout, UnknownCall
from dex_celery.ledger.events import START, AgentEvent, EventFilters
from dex_celery.ledger.ledger import LedgerCall
from dex_celery.model.event_types import EventType
from dex_celery.model.ids import CallKey, validate_id
from dex_celery.model.message_text import check_text
from dex_celery.model.policy import EffectClass
from dex_celery.model.records import AgentSnapshot, MessageRole, SessionRecord, ToolCallRecord

if TYPE_CHECKING:
    from dex_celery.engine import RuntimeSource


@translating_backend_errors
class DexClient:
    """What an agent loop uses: sessions, call requests, records, approvals and events.

    Get one with `Dex.client()`. Every method raises only dex-celery errors: bad input as
    `InvalidRequest` (nothing recorded), unknown names as `UnknownTool` / `UnknownCall` /
    `UnknownSession`, and Redis or database failures as `RedisUnavailable`,
    `DatabaseUnavailable` or `SchemaMissing`. A request that fails after its calls were (or may
    have been) recorded raises `RequestInFlight` instead: ask again with the same ids (S11.2).
    """

    def __init__(self, source: RuntimeSource) -> None:
        self.source = source

    # --- sessions ------------------------------------------------------------------------------

    def open_session(
        self, session_id: str, *, default_effect: EffectClass | str | None = None
    ) -> SessionRecord:
        """Create a session (or return it); its default effect applies to unclassified tools."""
        validate_id("session id", session_id)
        effect = EffectClass.parse(default_effect) if default_effect is not None else None
        return self.source.runtime.store.open_session(session_id, effect)

    def get_agent_snapshot(self, session_id: str) -> AgentSnapshot:
        """Every call of the session (status, error) and every message, oldest first."""
        calls, messages = self.source.runtime.store.snapshot(session_id)
        return AgentSnapshot(
            session_id=session_id, tool_calls=tuple(calls), messages=tuple(messages)
        )

    def send_user_message(self, session_id: str, text: str) -> bool:
        """Append a user message to the history (S7.4); True once it is recorded."""
        check_text(text, limit=self.source.runtime.settings.max_text_bytes)
        self.source.runtime.store.append_message(session_id, MessageRole.USER, text)
        return True

    def add_message(self, session_id: str, role: MessageRole, text: str) -> None:
        """Append a message of any role to the session's history (the model's own turns)."""
        check_text(text, limit=self.source.runtime.settings.max_text_bytes)
        self.source.runtime.store.append_message(session_id, MessageRole(role), text)

    # --- calls ---------------------------------------------------------------------------------

    def request_call(
        self,
        session_id: str,
        turn_id: str,
        tool_call_id: str,
        tool_name: str,
        arguments: Mapping[str, Any] | str,
        *,
        principal: str | None = None,
    ) -> ToolCallRecord:
        """Record and dispatch one call; the same ids twice are one call (S2.3).

        `principal`: the user or tenant the app acts for, the scope of write budgets kept per
        principal (S13.1).

        Raises `RequestInFlight` (`CallRecordedNotStarted`, `RecordingUnconfirmed`) when the
        call is recorded, or may be, but could not be started: it will run or be judged once
        the backends answer, and asking again with the same ids returns it. Any other error
        means nothing was recorded.
        """
        return self.request_calls(
            [CallRequest(session_id, turn_id, tool_call_id, tool_name, arguments, principal)]
        )[0]

    def request_calls(self, requests: Sequence[CallRequest]) -> list[ToolCallRecord]:
        """Several calls of one turn in one transaction; all are refused if one is bad.

        A failure after the transaction committed raises `CallRecordedNotStarted` naming every
        call of the request (`keys`), as `request_call` does.
        """
        return self.source.runtime.dispatcher.request(requests)

    def get_call(self, key: str) -> ToolCallRecord:
        """The record of the call with idempotency key `session/turn/call`."""
        CallKey.parse(key)
        record = self.source.runtime.store.get_call(key)
        if record is None:
            raise UnknownCall(f"no tool call {key!r}")
        return record

    def wait(
        self, keys: Sequence[str], *, timeout: float = 60.0, recorded: bool = True
    ) -> list[ToolCallRecord]:
        """Block until every call in `keys` has ended; `CallTimeout` after `timeout` seconds.

        Learns each outcome as soon as the ledger decides it (`tool_call_ended`). By default
        returns SQL's records, so what follows (the snapshot, the session's messages, another
        process's reads) agrees with them: the worker's recorder writes each outcome in its next
        batch, usually within milliseconds (`tool_call_finished` wakes this call); if it has
        not within `Settings.record_wait` of the decision (a recorder far behind, stopped or
        killed), this caller writes it itself, with the same conditional write, so whoever is
        first records it, once. A caller never waits for the sweeper's `unrecorded_grace`.

        `recorded=False` returns at the ledger's decision, each record as SQL will hold it
        (`engine/decided_outcomes.py`), without waiting for the write: the lowest latency, for a caller
        that uses only the returned records; the snapshot and the session's messages catch up
        within the recorder's next batch.

        With `recorded=True` that record is prepared at the decision too, while the recorder
        writes: when `tool_call_finished` says SQL now holds the same status and error, it is
        returned without reading SQL again; any other end is read back from SQL.
        """
        deadline = time.monotonic() + timeout
        runtime = self.source.runtime
        wanted = list(dict.fromkeys(keys))
        for key in wanted:
            CallKey.parse(key)
        # Taken before the first look, so no event of these calls can slip in between; on one
        # Redis in the same round trip as the first look.
        position, entries, unrecorded = runtime.ledger.position_and_read(wanted)
        ended: dict[str, ToolCallRecord] = {}
        stored: dict[str, ToolCallRecord] = {}  # the last SQL record of each call still going
        check = set(wanted)  # whose ledger entry to read
        look: set[str] = set()  # whose SQL record to read
        due: dict[str, float] = {}  # when a decided outcome's `record_wait` is over (monotonic)
        prepared: dict[str, ToolCallRecord] = {}  # recorded=True: the record SQL is getting
        first = True
        while True:
            asked = [k for k in wanted if k in check and k not in ended]
            if not first:
                entries = runtime.ledger.read_many(asked) if asked else {}
            # A call the ledger holds in flight has no record in SQL yet: SQL is read only for
            # the others (decided, awaiting approval, gone from the ledger).
            look.update(k for k in asked if (e := entries.get(k)) is None or e.status != "active")
            later = self._recorded_later(first, recorded, look, entries, unrecorded)
            look.difference_update(later)
            for key in wanted:
                if key in look and key not in ended:
                    record = self.get_call(key)
                    stored[key] = record
                    if record.finished:
                        ended[key] = record
            look = self._take_decided(asked, entries, stored, ended, due, recorded, prepared)
            due.update(later)
            first = False
            waiting = [k for k in wanted if k not in ended]
            if not waiting:
                return [ended[k] for k in keys]
            check = set()
            if look:
                continue  # this call recorded them: read them back
            now = time.monotonic()
            remaining = deadline - now
            if remaining <= 0:
                raise CallTimeout(f"calls still in flight after {timeout}s: {', '.join(waiting)}")
            wake = min([remaining, 1.0, *(d - now for k, d in due.items() if k in waiting)])
            position, finished, decided_now = self._next_end(position, set(waiting), max(wake, 0.0))
            look = set()
            for key, announced in finished.items():
                ready = prepared.get(key)
                if ready is not None and (ready.status.value, ready.error or "") == announced:
                    ended[key] = ready  # SQL holds what the ledger decided: no read back
                else:
                    look.add(key)
            if recorded:
                for key in decided_now - finished.keys():
                    due.setdefault(key, time.monotonic() + runtime.settings.record_wait)
                now = time.monotonic()
                # The decided ones are read now (ledger, SQL's pending record) to prepare their
                # record while the recorder writes it; the overdue ones to be recorded here.
                check = {k for k in waiting if due.get(k, now + 1) <= now}
                check |= decided_now - finished.keys()
            else:
                check = decided_now - finished.keys()
            if not finished and not decided_now and wake >= min(remaining, 1.0):
                # A quiet second: look at everything again (an event trimmed away or missed).
                look, check = set(waiting), set(waiting)

    def _recorded_later(
        self,
        first: bool,
        recorded: bool,
        look: set[str],
        entries: Mapping[str, LedgerCall | None],
        unrecorded: set[str],
    ) -> dict[str, float]:
        """At the first look of `wait(recorded=True)`: the calls the ledger decided and had not
        recorded when the events' position was taken. SQL cannot hold their record yet and
        their `tool_call_finished` is still to come, so their SQL read waits for it (or for
        their `record_wait`, when this caller records them: returned, as `due` times)."""
        if not first or not recorded or not unrecorded:
            return {}
        runtime = self.source.runtime
        wait = runtime.settings.record_wait
        later: dict[str, float] = {}
        for key in look & unrecorded:
            step = decided_step(entries.get(key))
            if step is None:
                continue
            age = runtime.ledger.now() - step.finished_at if step.finished_at is not None else 0.0
            later[key] = time.monotonic() + max(0.0, wait - age)
        return later

    def _take_decided(
        self,
        keys: Sequence[str],
        entries: Mapping[str, LedgerCall | None],
        stored: Mapping[str, ToolCallRecord],
        ended: dict[str, ToolCallRecord],
        due: dict[str, float],
        recorded: bool,
        prepared: dict[str, ToolCallRecord],
    ) -> set[str]:
        """The outcomes among `keys` the ledger decided and SQL lacks (`engine/decided_outcomes.py`).

        `recorded`: each decided at least `record_wait` ago is recorded now (the keys recorded
        are returned, to be read back from SQL); for the others `due` gets when their
        `record_wait` is over, and `prepared` the record SQL will hold. Otherwise each goes to
        `ended` as SQL will hold it."""
        runtime = self.source.runtime
        wait = runtime.settings.record_wait
        now: float | None = None
        written: set[str] = set()
        for key in keys:
            entry = entries.get(key)
            step = decided_step(entry)
            if key in ended:
                continue
            if step is None or entry is None or key not in stored:
                # Not an end a caller takes (the worker's path or the sweeper records it, and
                # `tool_call_finished` says so): nothing more to ask the ledger.
                due.pop(key, None)
                continue
            if not recorded:
                ended[key] = decided(stored[key], entry)
                continue
            prepared[key] = decided(stored[key], entry)
            now = runtime.ledger.now() if now is None else now
            age = now - step.finished_at if step.finished_at is not None else wait
            if age < wait:
                due[key] = time.monotonic() + (wait - age)
                continue
            runtime.steps.record(key, step, result=entry.result)
            due.pop(key, None)
            written.add(key)
        return written

    def _next_end(
        self, position: str, keys: set[str], block: float
    ) -> tuple[str, dict[str, tuple[str, str]], set[str]]:
        """Read events after `position` until one says a call of `keys` ended or `block` seconds
        pass. Returns the position read up to, the calls SQL now holds (`tool_call_finished`,
        with the status and error it announced) and the calls the ledger decided
        (`tool_call_ended`)."""
        events = self.source.runtime.events
        until = time.monotonic() + block
        finished: dict[str, tuple[str, str]] = {}
        decided: set[str] = set()
        while not finished and not decided:
            left = until - time.monotonic()
            if left <= 0:
                break
            for event in events.read(position, count=100, block=left):
                position = event.position
                if event.key in keys and event.type is EventType.TOOL_CALL_FINISHED:
                    status = event.status.value if event.status is not None else ""
                    finished[event.key] = (status, event.error or "")
                elif event.key in keys and event.type is EventType.TOOL_CALL_ENDED:
                    decided.add(event.key)
        return position, finished, decided

    # --- approvals (S6; dex_celery/engine/request/approvals.py) -----------------------------------

    def approve(
        self,
        key: str,
        approver: str,
        note: str | None = None,
        *,
        edit: Mapping[str, Any] | str | None = None,
    ) -> ToolCallRecord:
        """Approve a waiting call; it is dispatched under its recorded policy (S6.2), bound to
        what was approved (S13.3). `edit`: the arguments it should run with instead, checked
        against the tool's schema (`InvalidEdit`, nothing stored) and recorded (S13.3)."""
        return self.source.runtime.approvals.approve(key, approver, note, edit=edit)

    def reject(self, key: str, approver: str, reason: str | None = None) -> ToolCallRecord:
        """Reject a waiting call; it ends `rejected` and never runs (S6.2)."""
        return self.source.runtime.approvals.reject(key, approver, reason)

    def pending_approvals(
        self, session_id: str | None = None, *, limit: int = 100
    ) -> list[PendingApproval]:
        """Calls waiting for a decision, oldest first, secret arguments redacted."""
        return self.source.runtime.approvals.pending(session_id, limit=limit)

    # --- events (S7.3; dex_celery/ledger/events.py) -----------------------------------------------

    def events(self, after: str = START, **filters: Unpack[EventFilters]) -> Iterator[AgentEvent]:
        """AgentEvents after position `after` (`"0"` from the start, `"$"` from now).

        Keep the `position` of the last event handled and pass it as `after` to resume. Stops
        once caught up, unless `follow` (then waits for new events up to `timeout` seconds);
        `session_id` and `types` filter (`EventFilters`).
        """
        settings = self.source.settings
        return translated_iterator(
            self.source.runtime.events.iterate(after, **filters),
            settings.redis_url,
            settings.database_url,
        )


_P = ParamSpec("_P")
_R = TypeVar("_R")


def _in_thread(
    method: Callable[Concatenate[DexClient, _P], _R],
) -> Callable[Concatenate[AsyncDexClient, _P], Coroutine[Any, Any, _R]]:
    """`AsyncDexClient`'s coroutine of a `DexClient` call: the same signature and docstring,
    run in a worker thread, so the two clients cannot drift apart."""

    @functools.wraps(method)
    async def in_thread(client: AsyncDexClient, /, *args: _P.args, **kwargs: _P.kwargs) -> _R:
        return await asyncio.to_thread(method, client.sync, *args, **kwargs)

    return in_thread


class AsyncDexClient:
    """Coroutine versions of `DexClient`'s calls (S8.3)."""

    def __init__(self, source: RuntimeSource) -> None:
        self.sync = DexClient(source)

    async def open_session(
        self, session_id: str, *, default_effect: EffectClass | str | None = None
    ) -> SessionRecord:
        return await asyncio.to_thread(
            self.sync.open_session, session_id, default_effect=default_effect
        )

    async def get_agent_snapshot(self, session_id: str) -> AgentSnapshot:
        return await asyncio.to_thread(self.sync.get_agent_snapshot, session_id)

    async def send_user_message(self, session_id: str, text: str) -> bool:
        return await asyncio.to_thread(self.sync.send_user_message, session_id, text)

    request_call = _in_thread(DexClient.request_call)

    async def request_calls(self, requests: Sequence[CallRequest]) -> list[ToolCallRecord]:
        return await asyncio.to_thread(self.sync.request_calls, requests)

    async def get_call(self, key: str) -> ToolCallRecord:
        return await asyncio.to_thread(self.sync.get_call, key)

    async def wait(
        self, keys: Sequence[str], *, timeout: float = 60.0, recorded: bool = True
    ) -> list[ToolCallRecord]:
        return await asyncio.to_thread(self.sync.wait, keys, timeout=timeout, recorded=recorded)

    # --- approvals (S6; dex_celery/engine/request/approvals.py) -----------------------------------

    async def approve(
        self,
        key: str,
        approver: str,
        note: str | None = None,
        *,
        edit: Mapping[str, Any] | str | None = None,
    ) -> ToolCallRecord:
        return await asyncio.to_thread(self.sync.approve, key, approver, note, edit=edit)

    async def reject(self, key: str, approver: str, reason: str | None = None) -> ToolCallRecord:
        return await asyncio.to_thread(self.sync.reject, key, approver, reason)

    async def pending_approvals(
        self, session_id: str | None = None, *, limit: int = 100
    ) -> list[PendingApproval]:
        return await asyncio.to_thread(self.sync.pending_approvals, session_id, limit=limit)

    # --- events (S7.3; dex_celery/ledger/events.py) -----------------------------------------------

    def events(
        self, after: str = START, **filters: Unpack[EventFilters]
    ) -> AsyncIterator[AgentEvent]:
        """`DexClient.events` as an async iterator: `async for event in client.events(...)`.
        Redis failures while iterating are raised as `RedisUnavailable`, as everywhere else."""
        settings = self.sync.source.settings
        with backend_errors(settings.redis_url, settings.database_url):
            events = self.sync.source.runtime.events.aiterate(after, **filters)
        return translated_async_iterator(events, settings.redis_url, settings.database_url)
