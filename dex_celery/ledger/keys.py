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
|                              |        | lost data or went back in time; each call hash records  |
|                              |        | the epoch it was opened in (older ones are stale)       |
| `dex:dataset`                | string | `<run_id>:<evicted_keys>` of the Redis server that      |
|                              |        | holds the ledger, as last checked (rollback detection)  |
| `dex:ledger`                 | string | random id of this ledger, recorded in the database it   |
|                              |        | is bound to (one database, one ledger)                  |
| `dex:clock`                  | string | a frozen ledger time: only the unit tests set it        |
| `dex:replayed:<epoch>`       | string | set once the finished events lost with an older life    |
|                              |        | of the ledger were announced again (one process does it)|
| `dex:events`                 | stream | AgentEvents (S7.3)                                      |
| `dex:cursor:orphans`         | string | where the orphan check's paging through calls in flight |
|                              |        | stopped: `<requested_at>|<key>`                         |
| `dex:stats`                  | hash   | counters of rare events for metrics, e.g.               |
|                              |        | `claims_refused:<reason>` (one HINCRBY each)            |
| `dex:sweep_stats`            | hash   | the last sweep: `finished_at` (Redis time), `duration`, |
|                              |        | `errors` (metrics, `dex-celery status`, worker warnings)|
| `dex:webhooks:cursor`        | string | events stream position the webhook sender has queued to |
| `dex:webhooks:pending`       | hash   | delivery id -> JSON of a webhook not yet delivered      |
| `dex:webhooks:due`           | zset   | delivery id -> when its next try is due                 |
| `dex:webhooks:stats`         | hash   | per URL: delivered, retries, given up, last error       |
| `dex:worker_starts`          | hash   | worker node name -> JSON of its last start: pid, time,  |
|                              |        | starts under that name (`dex-celery status`)            |

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
    def dataset(self) -> str:
        return f"{self.prefix}:dataset"

    @property
    def ledger_id(self) -> str:
        return f"{self.prefix}:ledger"

    @property
    def clock(self) -> str:
        return f"{self.prefix}:clock"

    @property
    def events(self) -> str:
        return f"{self.prefix}:events"

    def replayed(self, epoch: str) -> str:
        return f"{self.prefix}:replayed:{epoch}"

    @property
    def orphan_cursor(self) -> str:
        return f"{self.prefix}:cursor:orphans"

    @property
    def stats(self) -> str:
        return f"{self.prefix}:stats"

    @property
    def sweep_stats(self) -> str:
        return f"{self.prefix}:sweep_stats"

    @property
    def webhook_cursor(self) -> str:
        return f"{self.prefix}:webhooks:cursor"

    @property
    def webhook_pending(self) -> str:
        return f"{self.prefix}:webhooks:pending"

    @property
    def webhook_due(self) -> str:
        return f"{self.prefix}:webhooks:due"

    @property
    def webhook_stats(self) -> str:
        return f"{self.prefix}:webhooks:stats"

    @property
    def worker_starts(self) -> str:
        return f"{self.prefix}:worker_starts"
