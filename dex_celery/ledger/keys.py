"""Every Redis key dex-celery writes is named here, and nowhere else.

Layout (prefix `dex` by default, `Settings.key_prefix`):

| key                          | type   | holds                                                   |
|------------------------------|--------|---------------------------------------------------------|
| `dex:call:{<key>}`           | hash   | one unfinished call: its policy numbers, the current    |
|                              |        | attempt (n, state, owner, fence, lease, deadlines), the |
|                              |        | outcome once decided, late result, attempt log          |
| `dex:idx:queue`              | zset   | call key -> schedule-to-start deadline of its enqueued  |
|                              |        | attempt (expire sweep)                                  |
| `dex:idx:lease`              | zset   | call key -> lease deadline of its running attempt       |
|                              |        | (lost-worker sweep)                                     |
| `dex:idx:close`              | zset   | call key -> start-to-close deadline (time-out sweep)    |
| `dex:idx:unrecorded`         | zset   | call key -> time its outcome was decided, until the SQL |
|                              |        | record has landed (record sweep)                        |
| `dex:epoch`                  | string | random id of this ledger's life; a new one means Redis  |
|                              |        | lost its data                                           |
| `dex:events`                 | stream | AgentEvents (S7.3)                                      |
| `dex:cursor:orphans`         | string | where the orphan check's paging through calls in flight |
|                              |        | stopped: `<requested_at>|<key>`                         |
| `dex:sweep:heartbeat`        | string | JSON `{"at": <Redis time>, "errors": n}` of the last    |
|                              |        | finished sweep (`dex-celery status`, worker warnings)   |

`<key>` is the idempotency key `session/turn/call`; wrapping it in braces makes it the hash
tag, so everything of one call lands in one slot if the data is ever sharded. The indexes are
global by design: one `ZRANGEBYSCORE ... LIMIT` per sweep reads only the due items. A cluster
deployment would need one set of indexes per slot; that is not built.

Only one attempt of a call is ever unfinished (a retry opens after the previous attempt has
ended), so the call hash carries the current attempt's fields directly and finished attempts
are appended to its `log` field.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class KeySpace:
    """Key names under one prefix."""

    prefix: str = "dex"

    def call(self, key: str) -> str:
        return f"{self.prefix}:call:{{{key}}}"

    @property
    def queue_index(self) -> str:
        return f"{self.prefix}:idx:queue"

    @property
    def lease_index(self) -> str:
        return f"{self.prefix}:idx:lease"

    @property
    def close_index(self) -> str:
        return f"{self.prefix}:idx:close"

    @property
    def unrecorded_index(self) -> str:
        return f"{self.prefix}:idx:unrecorded"

    @property
    def epoch(self) -> str:
        return f"{self.prefix}:epoch"

    @property
    def events(self) -> str:
        return f"{self.prefix}:events"

    @property
    def orphan_cursor(self) -> str:
        return f"{self.prefix}:cursor:orphans"

    @property
    def sweep_heartbeat(self) -> str:
        return f"{self.prefix}:sweep:heartbeat"
