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
| `dex:freeze`                 | string | the write freezes in force, JSON: tool name (or `*`) -> |
|                              |        | the freeze (`model/freeze.py`); read by `claim.lua` in  |
|                              |        | its MGET, re-asserted from SQL (`ledger/freeze.py`)     |
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
| `dex:budget:<name>:<scope>`  | hash   | a write budget's scope (S13.1): epoch, totals reserved, |
|                              |        | spent, held, and each call's charge; `...#spent` is a   |
|                              |        | zset of spent charges by time (rolling windows)         |

`<key>` is the idempotency key `session/turn/call`; wrapping it in braces makes it the hash
tag of the single-node layout above.

Shards (`Settings.ledger_shards`, a Redis Cluster: docs/redis.md, "Redis Cluster"): every key
of the table that a script touches exists once per shard, under the shard's hash tag:
`dex:{<tag>}:call:<key>`, `dex:{<tag>}:idx:queue`, `dex:{<tag>}:events`, `dex:{<tag>}:epoch`,
`dex:{<tag>}:dataset`, `dex:{<tag>}:clock`, `dex:{<tag>}:freeze`, `dex:{<tag>}:replayed:<epoch>`,
`dex:{<tag>}:running:<key>`, `dex:{<tag>}:budget:<name>:<scope>`. A call belongs to shard
`crc32(key) % shards`, so every script
(which touches one call, or one worker's calls of one shard) reads and writes one slot. The
deployment-wide keys (`ledger`, `cursor:orphans`, `stats`, `sweep_stats`, `webhooks:*`,
`worker_starts`) share the tag `{dex}`: `{dex}:ledger`. With one shard and no cluster the names
are exactly those of the table (`tagged` False).

Only one attempt of a call is ever unfinished (a retry opens after the previous attempt has
ended), so the call hash carries the current attempt's fields directly and finished attempts
are appended to its `log` field.
"""

from __future__ import annotations

import zlib
from dataclasses import dataclass, field

from redis.crc import key_slot

#: Hash slots of a Redis Cluster.
CLUSTER_SLOTS = 16384


@dataclass(frozen=True, slots=True)
class ShardKeys:
    """The keys of one ledger shard: its calls, due-indexes, events stream, epoch and marker.

    `tag` None is the single-node layout (the names above, unchanged). Otherwise every name
    carries the hash tag `{tag}`, so a script's keys (a call, its indexes, the stream, the
    epoch, the frozen clock) all live in one cluster slot: Redis Cluster runs a script only on
    keys of one slot.
    """

    prefix: str
    index: int = 0
    tag: str | None = None

    def _name(self, rest: str) -> str:
        if self.tag is None:
            return f"{self.prefix}:{rest}"
        return f"{self.prefix}:{{{self.tag}}}:{rest}"

    def call(self, key: str) -> str:
        if self.tag is None:
            return f"{self.prefix}:call:{{{key}}}"
        return self._name(f"call:{key}")

    def running(self, key: str) -> str:
        """The lease of a fenced attempt whose tool may still be running (the repeat guard,
        S5.4): set by `time_out.lua`, renewed by the worker's heartbeat pump while the tool
        runs, deleted when it returns, lapsing when the worker dies. Same hash slot as the call."""
        if self.tag is None:
            return f"{self.prefix}:running:{{{key}}}"
        return self._name(f"running:{key}")

    @property
    def queue_index(self) -> str:
        return self._name("idx:queue")

    @property
    def lease_index(self) -> str:
        return self._name("idx:lease")

    @property
    def close_index(self) -> str:
        return self._name("idx:close")

    @property
    def unrecorded_index(self) -> str:
        return self._name("idx:unrecorded")

    @property
    def epoch(self) -> str:
        return self._name("epoch")

    @property
    def dataset(self) -> str:
        return self._name("dataset")

    @property
    def clock(self) -> str:
        return self._name("clock")

    @property
    def events(self) -> str:
        return self._name("events")

    @property
    def freeze(self) -> str:
        """The write freezes in force (S13.2), one copy per shard so that `claim.lua` reads
        them in the call's own slot."""
        return self._name("freeze")

    def replayed(self, epoch: str) -> str:
        return self._name(f"replayed:{epoch}")

    def budget(self, name: str, scope_id: str) -> str:
        """One write budget's scope (S13.1, `scripts/_budget.lua`): a hash of its totals and
        charges; `<this>#spent` is its sorted set of spent charges. In the shard's slot, so the
        script that opens a call reserves its budget in the same step."""
        return self._name(f"budget:{name}:{scope_id}")


def spread_tag(prefix: str, index: int, shards: int) -> str:
    """The hash tag of shard `index` of `shards`: `<prefix>.<index>.<n>` with the smallest `n`
    whose cluster slot lies in the index-th of `shards` equal slot ranges. A cluster made by
    `redis-cli --cluster create` gives each primary an equal range, so with `shards` a multiple
    of the primaries every primary holds as many shards (docs/redis.md, "Redis Cluster")."""
    low = index * CLUSTER_SLOTS // shards
    high = (index + 1) * CLUSTER_SLOTS // shards
    n = 0
    while True:
        tag = f"{prefix}.{index}.{n}"
        if low <= key_slot(tag.encode()) < high:
            return tag
        n += 1


@dataclass(frozen=True, slots=True)
class KeySpace:
    """Key names under one prefix, split into `shards` shards.

    `tagged` False with one shard is the single-node layout, every name as in the table above.
    `tagged` (a Redis Cluster, or more than one shard) puts each shard's keys under its own
    hash tag and the deployment-wide keys under `{<prefix>}`.
    """

    prefix: str = "dex"
    shards: int = 1
    tagged: bool = False
    _shards: tuple[ShardKeys, ...] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if self.shards < 1:
            raise ValueError(f"a ledger has at least one shard, got {self.shards}")
        tagged = self.tagged or self.shards > 1
        object.__setattr__(self, "tagged", tagged)
        object.__setattr__(
            self,
            "_shards",
            tuple(
                ShardKeys(
                    self.prefix, i, spread_tag(self.prefix, i, self.shards) if tagged else None
                )
                for i in range(self.shards)
            ),
        )

    @property
    def all_shards(self) -> tuple[ShardKeys, ...]:
        return self._shards

    def shard(self, index: int) -> ShardKeys:
        return self._shards[index]

    def shard_of(self, key: str) -> int:
        """The shard a call belongs to, from its idempotency key alone (stable across
        processes: CRC-32, not Python's salted `hash`)."""
        return zlib.crc32(key.encode()) % self.shards if self.shards > 1 else 0

    def of(self, key: str) -> ShardKeys:
        """The keys of the shard that holds call `key`."""
        return self._shards[self.shard_of(key)]

    def call(self, key: str) -> str:
        return self.of(key).call(key)

    def running(self, key: str) -> str:
        return self.of(key).running(key)

    def budget(self, name: str, scope_id: str) -> str:
        """A write budget's scope, in shard 0's slot: budgets need a ledger of one shard, so
        every call's hash shares this slot (`Settings` refuses budgets with more shards)."""
        return self._shards[0].budget(name, scope_id)

    # --- shard 0 (the single shard of a single-node ledger) ---------------------------------------

    @property
    def queue_index(self) -> str:
        return self._shards[0].queue_index

    @property
    def lease_index(self) -> str:
        return self._shards[0].lease_index

    @property
    def close_index(self) -> str:
        return self._shards[0].close_index

    @property
    def unrecorded_index(self) -> str:
        return self._shards[0].unrecorded_index

    @property
    def epoch(self) -> str:
        return self._shards[0].epoch

    @property
    def dataset(self) -> str:
        return self._shards[0].dataset

    @property
    def clock(self) -> str:
        return self._shards[0].clock

    @property
    def events(self) -> str:
        return self._shards[0].events

    def replayed(self, epoch: str) -> str:
        return self._shards[0].replayed(epoch)

    # --- deployment-wide keys ----------------------------------------------------------------------

    def _global(self, rest: str) -> str:
        if self.tagged:
            return f"{{{self.prefix}}}:{rest}"
        return f"{self.prefix}:{rest}"

    @property
    def ledger_id(self) -> str:
        return self._global("ledger")

    @property
    def orphan_cursor(self) -> str:
        return self._global("cursor:orphans")

    @property
    def stats(self) -> str:
        return self._global("stats")

    @property
    def sweep_stats(self) -> str:
        return self._global("sweep_stats")

    @property
    def webhook_cursor(self) -> str:
        return self._global("webhooks:cursor")

    @property
    def webhook_pending(self) -> str:
        return self._global("webhooks:pending")

    @property
    def webhook_due(self) -> str:
        return self._global("webhooks:due")

    @property
    def webhook_stats(self) -> str:
        return self._global("webhooks:stats")

    @property
    def worker_starts(self) -> str:
        return self._global("worker_starts")

    def preview_lock(self, key: str) -> str:
        """Held while a worker runs the preview of call `key`: one run at a time per call
        (docs/guardrails.md, "Previews")."""
        return self._global(f"preview:{key}")
