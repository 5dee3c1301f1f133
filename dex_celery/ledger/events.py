"""AgentEvents: the Redis Stream of what happens to tool calls (S7.3).

The ledger scripts write most events atomically with the transition they describe
(`tool_call_requested` in open.lua, `tool_call_started` in claim.lua, `tool_call_late_result`
in finish.lua, `tool_call_finished` in recorded.lua); this module reads them back as typed,
frozen `AgentEvent` values, and writes the few that happen outside a script.

A consumer keeps the `position` of the last event it handled and passes it as `after=` to
resume: stream ids only grow, so it sees every later event once, in the order they were
written. The stream is trimmed to about `Settings.events_maxlen` entries (`MAXLEN ~`, whole
macro-nodes at a time); a consumer that falls further behind than that can ask
`trimmed_after(position)` whether it missed anything, and must then rebuild from the snapshot.

A sharded ledger (docs/redis.md, "Redis Cluster") has one stream per shard, each written in the
same step as its shard's transitions. A reader then reads every shard's stream and merges them
by entry id (Redis's time of each append, per primary); its position is the list of the last
id it has read in each stream, joined by commas in shard order (`1712345678901-0,0-0,...`), so
resuming sees every later event of every shard once. One event's order across shards is its
append time, as close as the primaries' clocks agree; within a call (one shard) it is exact.
A plain stream id as `after=` on a sharded ledger means that id in every stream.
"""

from __future__ import annotations

import asyncio
import dataclasses
import re
import time
from collections.abc import AsyncIterator, Callable, Collection, Iterator, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import TYPE_CHECKING, Any, TypedDict, Unpack, cast

import redis

from dex_celery.errors import InvalidEventPosition
from dex_celery.model.event_types import EventType as EventType  # re-exported: part of this API
from dex_celery.model.ids import KEY_SEPARATOR
from dex_celery.model.outcomes import CallStatus

if TYPE_CHECKING:
    pass

#: Read from the start of the stream.
START = "0"
#: Read only events written after the read begins.
NOW = "$"
#: Longest single blocking read; a `follow` iterator re-checks its deadline this often.
MAX_BLOCK_SECONDS = 1.0

_POSITION = re.compile(r"^\d+(-\d+)?(,\d+(-\d+)?)*$")
#: Between two rounds of non-blocking reads of a sharded ledger's streams, while a reader waits.
SHARD_POLL_SECONDS = 0.05


_KNOWN_TYPES = frozenset(t.value for t in EventType)


@dataclass(frozen=True, slots=True)
class AgentEvent:
    """One entry of the stream. `type` is an `EventType` for every event dex-celery writes.

    `position` is the stream id: pass it as `after=` to resume after this event.
    `session_id`, `turn_id` and `tool_call_id` are derived from `key` (`session/turn/call`).
    """

    position: str
    type: EventType | str
    key: str
    session_id: str
    turn_id: str
    tool_call_id: str
    status: CallStatus | None = None
    error: str | None = None
    attempt: int | None = None
    fields: Mapping[str, str] = field(
        default_factory=lambda: MappingProxyType({}), compare=False, hash=False
    )
    #: The entry's own stream id; "" when it equals `position` (one stream).
    entry_id: str = field(default="", compare=False)

    @property
    def timestamp(self) -> float:
        """Unix seconds at which Redis appended the event (from the stream id)."""
        return int((self.entry_id or self.position).split("-", 1)[0]) / 1000.0

    @classmethod
    def from_entry(cls, position: str | bytes, raw: Mapping[Any, Any]) -> AgentEvent:
        values = {_text(k): _text(v) for k, v in raw.items()}
        kind = values.get("type", "")
        key = values.get("key", "")
        parts = key.split(KEY_SEPARATOR)
        session_id, turn_id, tool_call_id = parts if len(parts) == 3 else ("", "", "")
        status_text = values.get("status", "")
        attempt_text = values.get("attempt", "")
        return cls(
            position=_text(position),
            type=EventType(kind) if kind in _KNOWN_TYPES else kind,
            key=key,
            session_id=session_id,
            turn_id=turn_id,
            tool_call_id=tool_call_id,
            status=(
                CallStatus(status_text) if status_text in CallStatus._value2member_map_ else None
            ),
            error=values.get("error") or None,
            attempt=int(attempt_text) if attempt_text.isdigit() else None,
            fields=MappingProxyType(values),
        )


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _id_tuple(position: str) -> tuple[int, int]:
    ms, _, seq = position.partition("-")
    return int(ms), int(seq or 0)


def check_position(position: object) -> str:
    """`0`, `$`, a stream id, or (a sharded ledger) stream ids joined by commas; anything else
    is an `InvalidEventPosition`."""
    if not isinstance(position, str) or (position != NOW and not _POSITION.match(position)):
        raise InvalidEventPosition(
            f"event position {position!r} must be '0', '$' or a stream id like '1712345678901-0'"
        )
    return position


def newest_position(reply: Any) -> str:
    """The id of an `XREVRANGE stream + - COUNT 1` reply, `0-0` for an empty stream."""
    return _text(reply[0][0]) if reply else "0-0"


class AgentEvents:
    """Read and append the AgentEvents stream of one deployment (one key prefix)."""

    def __init__(
        self,
        client: redis.Redis,
        stream: str,
        *,
        maxlen: int,
        streams: tuple[str, ...] = (),
        stream_of: Callable[[str], str] | None = None,
    ) -> None:
        self.client = client
        self.stream = stream
        self.maxlen = maxlen
        #: Every shard's stream, in shard order (one: `stream`).
        self.streams = streams or (stream,)
        self._stream_of = stream_of or (lambda _key: stream)

    @property
    def sharded(self) -> bool:
        return len(self.streams) > 1

    # --- writing -------------------------------------------------------------------------------

    def publish(self, type: EventType, key: str, **fields: str) -> str:
        """Append one event, trimming the stream to about `maxlen` entries; returns its position.

        The one way events are published outside the ledger's scripts (which append theirs in
        the same atomic step as the transition they announce)."""
        entry = {"type": type.value, "key": key, **fields}
        return _text(
            self.client.xadd(
                self._stream_of(key), cast(Any, entry), maxlen=self.maxlen, approximate=True
            )
        )

    def publish_finished(self, key: str, *, status: str, error: str) -> str:
        """The finished event of a call that ended without a ledger entry (approvals, lost data)."""
        return self.publish(EventType.TOOL_CALL_FINISHED, key, status=status, error=error)

    # --- reading -------------------------------------------------------------------------------

    def latest_position(self) -> str:
        """The position of the newest event (`0-0` for an empty stream): 'from now on'."""
        ids = []
        for stream in self.streams:
            ids.append(newest_position(self.client.xrevrange(stream, "+", "-", count=1)))
        return ",".join(ids)

    def _positions(self, after: str) -> list[str]:
        """`after` as one stream id per stream."""
        parts = after.split(",")
        if len(parts) == len(self.streams):
            return parts
        if len(parts) == 1:
            return parts * len(self.streams)
        raise InvalidEventPosition(
            f"event position {after!r} names {len(parts)} streams; this ledger has "
            f"{len(self.streams)}"
        )

    def read(
        self, after: str = START, *, count: int = 100, block: float | None = None
    ) -> list[AgentEvent]:
        """Up to `count` events after `after`; waits up to `block` seconds if there are none."""
        after = check_position(after)
        if after == NOW:
            after = self.latest_position()
        if self.sharded:
            return self._read_shards(self._positions(after), count, block)
        wait_ms = None if block is None else max(1, int(block * 1000))
        reply: Any = self.client.xread({self.stream: after}, count=count, block=wait_ms)
        events: list[AgentEvent] = []
        for _stream, entries in reply or []:
            events.extend(AgentEvent.from_entry(pos, raw) for pos, raw in entries)
        return events

    def _read_shards(
        self, positions: list[str], count: int, block: float | None
    ) -> list[AgentEvent]:
        """Every shard's stream after its position, merged by entry id, at most `count`.

        One XREAD per stream (a cluster serves no read across slots); while nothing is there
        and `block` allows, reads again every `SHARD_POLL_SECONDS`."""
        deadline = None if block is None else time.monotonic() + block
        while True:
            found: list[tuple[tuple[int, int], int, str, Any]] = []
            for i, (stream, after) in enumerate(zip(self.streams, positions, strict=True)):
                reply: Any = self.client.xread({stream: after}, count=count)
                for _stream, entries in reply or []:
                    found.extend(
                        (_id_tuple(_text(pos)), i, _text(pos), raw) for pos, raw in entries
                    )
            if found or deadline is None or time.monotonic() >= deadline:
                break
            time.sleep(min(SHARD_POLL_SECONDS, max(0.0, deadline - time.monotonic())))
        found.sort(key=lambda item: (item[0], item[1]))
        events: list[AgentEvent] = []
        current = list(positions)
        for _id, i, pos, raw in found[:count]:
            current[i] = pos
            event = AgentEvent.from_entry(",".join(current), raw)
            events.append(dataclasses.replace(event, entry_id=pos))
        return events

    def iterate(self, after: str = START, **filters: Unpack[EventFilters]) -> Iterator[AgentEvent]:
        """Events after `after`, oldest first, optionally only one session's or some types
        (`EventFilters`).

        Without `follow`, stops once it has caught up with the stream. With `follow`, waits for
        new events until `timeout` seconds have passed (forever if None). Filtering happens here:
        the stream is shared by every session, so skipped events still advance the position.
        A bad `after` raises `InvalidEventPosition` here, not on the first `next()`.
        """
        return self._iterate(_Cursor(check_position(after), _Query.of(filters)))

    def _iterate(self, cursor: _Cursor) -> Iterator[AgentEvent]:
        if cursor.position == NOW:
            cursor.position = self.latest_position()
        while (block := cursor.next_block()) is not _CAUGHT_UP:
            yield from cursor.take(self.read(cursor.position, count=cursor.batch, block=block))

    def aiterate(
        self, after: str = START, **filters: Unpack[EventFilters]
    ) -> AsyncIterator[AgentEvent]:
        """`iterate` as an async iterator; each blocking read runs in a worker thread."""
        return self._aiterate(_Cursor(check_position(after), _Query.of(filters)))

    async def _aiterate(self, cursor: _Cursor) -> AsyncIterator[AgentEvent]:
        if cursor.position == NOW:
            cursor.position = await asyncio.to_thread(self.latest_position)
        while (block := cursor.next_block()) is not _CAUGHT_UP:
            read = asyncio.to_thread(self.read, cursor.position, count=cursor.batch, block=block)
            for event in cursor.take(await read):
                yield event

    def trimmed_after(self, position: str) -> bool:
        """True if events after `position` may have been trimmed away (the consumer fell behind
        by more than about `maxlen` events and should rebuild from the snapshot).

        Trimming removes the oldest entries, so this holds when something was removed and
        `position` is older than the oldest entry left. It can say True for a consumer whose
        position is exactly the last entry removed; it never says False after a real gap.
        """
        position = check_position(position)
        if position == NOW:
            return False
        return any(
            self._trimmed(stream, after)
            for stream, after in zip(self.streams, self._positions(position), strict=True)
        )

    def _trimmed(self, stream: str, position: str) -> bool:
        try:
            info: Any = self.client.xinfo_stream(stream)
        except redis.ResponseError:  # no stream yet: nothing was ever trimmed
            return False
        added = int(info.get("entries-added", info.get("length", 0)))
        if added <= int(info.get("length", 0)):
            return False
        first = info.get("first-entry")
        return first is None or _id_tuple(position) < _id_tuple(_text(first[0]))

    def length(self) -> int:
        return sum(int(cast(Any, self.client.xlen(stream))) for stream in self.streams)


class EventFilters(TypedDict, total=False):
    """What a reader of the stream may ask for (`iterate`, `aiterate`, the clients' `events`)."""

    #: Only this session's events.
    session_id: str | None
    #: Only events of these types (`EventType` values).
    types: Collection[str] | None
    #: Wait for new events instead of stopping once caught up.
    follow: bool
    #: With `follow`: stop after this many seconds (None: never).
    timeout: float | None
    #: Events read per round trip.
    batch: int


@dataclass(frozen=True, slots=True)
class _Query:
    session_id: str | None = None
    types: Collection[str] | None = None
    follow: bool = False
    timeout: float | None = None
    batch: int = 100

    @classmethod
    def of(cls, filters: EventFilters) -> _Query:
        return cls(**filters)

    def deadline(self) -> float | None:
        return None if self.timeout is None else time.monotonic() + self.timeout

    def wants(self, event: AgentEvent) -> bool:
        return _wanted(event, self.session_id, self.types)


#: `_block`'s answer when a follower's time is up.
_CAUGHT_UP = -1.0


class _Cursor:
    """Where one iteration over the events stands, so the sync and the async iterator share
    every rule but the read itself: filtering happens here and skipped events still advance
    the position; without `follow` the iteration ends at the first empty read."""

    def __init__(self, position: str, query: _Query) -> None:
        self.position = position
        self.query = query
        self.batch = query.batch
        self.deadline = query.deadline()
        self.caught_up = False

    def next_block(self) -> float | None:
        """How long the next read may wait (see `_block`), `_CAUGHT_UP` once it is over."""
        return _CAUGHT_UP if self.caught_up else _block(self.query.follow, self.deadline)

    def take(self, events: list[AgentEvent]) -> list[AgentEvent]:
        """The wanted events of one read, moving the position past all of them."""
        if not events and not self.query.follow:
            self.caught_up = True
        for event in events:
            self.position = event.position
        return [event for event in events if self.query.wants(event)]


def _block(follow: bool, deadline: float | None) -> float | None:
    """How long the next read may wait: None (not at all) without `follow`, `_CAUGHT_UP` once
    its deadline has passed."""
    if not follow:
        return None
    remaining = MAX_BLOCK_SECONDS if deadline is None else deadline - time.monotonic()
    return _CAUGHT_UP if remaining <= 0 else min(remaining, MAX_BLOCK_SECONDS)


def _wanted(event: AgentEvent, session_id: str | None, types: Collection[str] | None) -> bool:
    if session_id is not None and event.session_id != session_id:
        return False
    return types is None or str(event.type) in {str(t) for t in types}
