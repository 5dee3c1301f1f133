"""Checks made before acting on ledger state: is this Redis the database's ledger, and has it
gone back in time since it was last looked at? (docs/ledger.md, "Rollback" and "One database,
one ledger".)

Redis can come back holding less than it acknowledged: restarted from an older snapshot, a
replica promoted while it lagged, a restored backup, keys evicted under memory pressure. None
of these leaves a mark in the data itself, so the ledger keeps a marker of the server that holds
it, `<run_id>:<evicted_keys>`, in Redis. Any server restart or replacement changes `run_id`; an
evicting policy raises `evicted_keys`. When the marker stored in the data no longer matches the
server, the data may be older than what was acknowledged, and the ledger starts a new life: a
new epoch, which makes every call hash of the old life stale, so the calls in flight are judged
from the system of record, conservatively (S10.2). A restart that lost nothing (an append-only
file fsynced on every write) is treated the same way: from inside Redis it cannot be told apart
from a restored backup.

A sharded ledger (docs/redis.md, "Redis Cluster") keeps one epoch and one marker per shard, and
compares each shard's marker with the primary that serves the shard's slot: a failover of one
primary of a cluster starts a new life for the shards that primary held, and only those. The
epoch this process passes around is then the shards' epochs joined (`ledger.join_epochs`).
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

from redis.cluster import RedisCluster
from sqlalchemy import Engine

from dex_celery.errors import LedgerMismatch
from dex_celery.ledger.keys import ShardKeys
from dex_celery.ledger.ledger import Ledger, join_epochs
from dex_celery.store.bindings import bind, read_binding

log = logging.getLogger("dex_celery.ledger")


def ledger_location(redis_url: str, key_prefix: str, sentinel_master: str | None = None) -> str:
    """Where a ledger lives, as settings name it: `host:port/db prefix`, the socket path, or
    the Sentinel master's name (its address changes with every failover)."""
    parts = urlsplit(redis_url)
    if parts.scheme == "sentinel":
        where = f"sentinel master {sentinel_master or '?'}"
    elif parts.scheme.endswith("+cluster"):
        where = f"cluster {parts.netloc.rpartition('@')[2]}"
    elif parts.scheme == "unix":
        where = parts.path
    else:
        host = (parts.hostname or "127.0.0.1").lower()
        host = "127.0.0.1" if host == "localhost" else host
        db = parts.path.strip("/") or "0"
        where = f"{host}:{parts.port or 6379}/{db}"
    return f"{where} {key_prefix}"


@dataclass(frozen=True, slots=True)
class Observation:
    """What one look at Redis found."""

    epoch: str | None
    marker: str | None
    ledger_id: str | None
    server_marker: str
    #: Keys the server has evicted since it started.
    evicted: int = 0


class LedgerGuard:
    """Run `check()` before acting on ledger state; it returns the epoch in force."""

    def __init__(
        self,
        ledger: Ledger,
        engine: Callable[[], Engine],
        location: str,
        *,
        new_id: Callable[[], str] = lambda: uuid.uuid4().hex,
    ) -> None:
        self.ledger = ledger
        self.engine = engine
        self.location = location
        self.new_id = new_id

    def check(self) -> str:
        """The epoch in force: one shard's, or (a sharded ledger) every shard's joined."""
        shards = self.ledger.keys.all_shards
        seen = [self._look(shard) for shard in shards]
        ledger_id = self._bound(seen[0])
        if seen[0].ledger_id != ledger_id:
            self.ledger.client.set(self.ledger.keys.ledger_id, ledger_id, nx=True)
        return join_epochs([self._epoch(s, shard) for s, shard in zip(seen, shards, strict=True)])

    def _look(self, shard: ShardKeys) -> Observation:
        client: Any = self.ledger.client
        if isinstance(client, RedisCluster):
            # The primary that serves this shard's slot, whose run id and evictions decide.
            node = client.get_node_from_key(shard.epoch)  # type: ignore[no-untyped-call]
            server = client.info("server", target_nodes=node)
            stats = client.info("stats", target_nodes=node)
            epoch, marker = client.get(shard.epoch), client.get(shard.dataset)
            ledger_id = client.get(self.ledger.keys.ledger_id)
        else:
            pipe = client.pipeline(transaction=False)
            pipe.get(shard.epoch)
            pipe.get(shard.dataset)
            pipe.get(self.ledger.keys.ledger_id)
            pipe.info("server")
            pipe.info("stats")
            epoch, marker, ledger_id, server, stats = pipe.execute()
        run_id = server.get("run_id", "unknown")
        evicted = stats.get("evicted_keys", 0)
        return Observation(
            epoch=None if epoch is None else str(epoch),
            marker=None if marker is None else str(marker),
            ledger_id=None if ledger_id is None else str(ledger_id),
            server_marker=f"{run_id}:{evicted}",
            evicted=int(evicted),
        )

    def _bound(self, seen: Observation) -> str:
        """The ledger id this process may act as; raises `LedgerMismatch` for another ledger."""
        engine = self.engine()
        binding = read_binding(engine)
        if binding is None:
            candidate = seen.ledger_id or self.new_id()
            binding = bind(engine, candidate, self.location, self.ledger.now())
        if seen.ledger_id == binding.ledger_id:
            return binding.ledger_id
        if seen.ledger_id is None and binding.location == self.location:
            # The bound Redis itself, come back empty: a loss of data, handled as a rollback.
            return binding.ledger_id
        found = f"ledger {seen.ledger_id}" if seen.ledger_id else "no ledger"
        raise LedgerMismatch(
            f"this database belongs to the ledger at {binding.location} (ledger "
            f"{binding.ledger_id}); this process's Redis at {self.location} holds {found}: "
            "refusing to act on the database's calls (one database, one ledger)"
        )

    def _epoch(self, seen: Observation, shard: ShardKeys) -> str:
        if seen.marker == seen.server_marker and seen.epoch is not None:
            return seen.epoch
        if seen.marker is None and seen.epoch is not None and seen.evicted == 0:
            # A ledger written before the marker existed: adopt it as it is. Not after any
            # eviction: the marker itself may be what was evicted.
            self.ledger.client.set(shard.dataset, seen.server_marker, nx=True)
            return seen.epoch
        where = (
            self.location
            if len(self.ledger.keys.all_shards) == 1
            else (f"{self.location} shard {shard.index}")
        )
        if seen.epoch is None and seen.marker is None:
            log.info("ledger %s: no epoch yet (first start or empty Redis); starting one", where)
        else:
            log.warning(
                "ledger %s: Redis may hold less than it acknowledged (server %s, data written "
                "under %s): starting a new ledger epoch; calls in flight are judged from the "
                "database, conservatively",
                where,
                seen.server_marker,
                seen.marker,
            )
        _, epoch = self.ledger.rotate(
            expected_dataset=seen.marker or "",
            dataset=seen.server_marker,
            epoch=self.new_id(),
            shard=shard.index,
        )
        return epoch
