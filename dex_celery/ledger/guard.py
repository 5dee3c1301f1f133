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
from dex_celery.ledger.freeze import reassert
from dex_celery.ledger.keys import ShardKeys
from dex_celery.ledger.ledger import Ledger, join_epochs
from dex_celery.ledger.private_redis import MARK_KEY, bound_ledger_answers, this_host
from dex_celery.store.bindings import Binding, LedgerOrigin, bind, read_binding, rebind
from dex_celery.store.freezes import WriteFreezes

#: The command an operator runs (naming the deployment's app with -A) to bind a database to the
#: ledger its processes now use; the CLI's error line puts the app in (`cli/main.py`).
REBIND_COMMAND = "dex-celery db rebind-ledger --yes"
#: The same for a `dev` or `demo` stack, whose private Redis is gone when it stops: the database
#: is released, and the next stack's first look binds it to its own ledger.
RELEASE_COMMAND = "dex-celery db rebind-ledger --release --yes"

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
    #: The host whose `dev`/`demo` started this Redis for itself, if it is such a private one.
    private_host: str | None = None

    @property
    def origin(self) -> LedgerOrigin:
        return LedgerOrigin.CONFIGURED if self.private_host is None else LedgerOrigin.PRIVATE


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
            private = None  # a cluster is always configured
        else:
            pipe = client.pipeline(transaction=False)
            pipe.get(shard.epoch)
            pipe.get(shard.dataset)
            pipe.get(self.ledger.keys.ledger_id)
            pipe.info("server")
            pipe.info("stats")
            pipe.get(MARK_KEY)
            epoch, marker, ledger_id, server, stats, private = pipe.execute()
        run_id = server.get("run_id", "unknown")
        evicted = stats.get("evicted_keys", 0)
        return Observation(
            epoch=None if epoch is None else str(epoch),
            marker=None if marker is None else str(marker),
            ledger_id=None if ledger_id is None else str(ledger_id),
            server_marker=f"{run_id}:{evicted}",
            evicted=int(evicted),
            private_host=None if private is None else str(private),
        )

    def _bound(self, seen: Observation) -> str:
        """The ledger id this process may act as; raises `LedgerMismatch` for another ledger."""
        engine = self.engine()
        binding = read_binding(engine)
        if binding is None:
            candidate = seen.ledger_id or self.new_id()
            binding = bind(
                engine,
                candidate,
                self.location,
                self.ledger.now(),
                origin=seen.origin,
                origin_host=seen.private_host,
            )
        if seen.ledger_id == binding.ledger_id:
            return binding.ledger_id
        if seen.ledger_id is None and binding.location == self.location:
            # The bound Redis itself, come back empty: a loss of data, handled as a rollback.
            return binding.ledger_id
        if seen.ledger_id is None and self._private_ledger_gone(binding):
            return self._start_new_ledger(binding, seen)
        raise LedgerMismatch(self._refusal(binding, seen))

    def _private_ledger_gone(self, binding: Binding) -> bool:
        """Is the bound ledger a private Redis of `dev`/`demo` on this host that no longer
        answers? Then nothing can act on it any more: the ledger is gone for good."""
        return (
            binding.origin is LedgerOrigin.PRIVATE
            and binding.origin_host == this_host()
            and not bound_ledger_answers(binding.location, binding.ledger_id, self.ledger.keys)
        )

    def _start_new_ledger(self, gone: Binding, seen: Observation) -> str:
        """Bind the database to this process's (empty) Redis: a new ledger, whose first look
        starts a new life; every call in flight is then judged from SQL as after a rollback
        (docs/ledger.md, "Rollback"): a write whose claim SQL holds ends `outcome_unknown`."""
        binding = rebind(
            self.engine(),
            expected=gone.ledger_id,
            ledger_id=self.new_id(),
            location=self.location,
            now=self.ledger.now(),
            origin=seen.origin,
            origin_host=seen.private_host,
        )
        if binding.ledger_id == gone.ledger_id or binding.location != self.location:
            # Another process rebound the database elsewhere first: this one is not its ledger.
            raise LedgerMismatch(self._refusal(binding, seen))
        log.warning(
            "ledger: this database was bound to the private Redis at %s, which `dex-celery "
            "dev` or `demo` started and which is gone; bound now to the ledger at %s (a new "
            "ledger): calls in flight are judged from the database, as after a rollback",
            gone.location,
            self.location,
        )
        return binding.ledger_id

    def _refusal(self, binding: Binding, seen: Observation) -> str:
        """The `LedgerMismatch` text: what is wrong, and how to recover."""
        found = f"ledger {seen.ledger_id}" if seen.ledger_id else "no ledger"
        said = (
            f"this database belongs to the ledger at {binding.location} (ledger "
            f"{binding.ledger_id}); this process's Redis at {self.location} holds {found}: "
            "refusing to act on the database's calls (one database, one ledger)"
        )
        if seen.ledger_id is not None:
            return (
                f"{said}. That Redis holds another database's ledger: give this deployment "
                "its own Redis or DEX_KEY_PREFIX, or point it at its own database"
            )
        if binding.origin is LedgerOrigin.PRIVATE and binding.origin_host == this_host():
            return (
                f"{said}. The database's ledger is the private Redis of a `dex-celery dev` or "
                "`demo` that still runs on this host: stop it first, or give this run a "
                "database of its own (DEX_DATABASE_URL)"
            )
        if seen.origin is LedgerOrigin.PRIVATE:
            # A `dev` or `demo` stack: its Redis lives only while it runs, so the database is
            # released for the next stack's first look rather than bound to this one.
            return (
                f"{said}. If that ledger is gone for good and no process uses it any more, "
                f"release the database with `{RELEASE_COMMAND}`, naming the app with -A, and "
                'start again (docs/ledger.md, "One database, one ledger", says what it risks)'
            )
        return (
            f"{said}. If that ledger is gone for good and no process uses it any more, bind "
            f"the database to this Redis with `{REBIND_COMMAND}`, naming the deployment's app "
            'with -A (docs/ledger.md, "One database, one ledger", says what it risks)'
        )

    def rebind(self) -> tuple[Binding | None, Binding]:
        """Bind the database to this process's Redis, whatever ledger it was bound to (the
        operator's `dex-celery db rebind-ledger`). Returns (the binding before, the binding
        now; the same when the database was bound to this Redis already, and nothing changed).
        Every shard starts a new life, so each call in flight is judged from SQL as after a
        rollback. Refuses (`LedgerMismatch`) a Redis that holds another database's ledger."""
        engine = self.engine()
        before = read_binding(engine)
        seen = self._look(self.ledger.keys.shard(0))
        if before is not None and seen.ledger_id == before.ledger_id:
            return before, before  # bound to this Redis already: nothing to start again
        if before is not None and seen.ledger_id is not None:
            raise LedgerMismatch(self._refusal(before, seen))
        ledger_id = seen.ledger_id or self.new_id()
        now = self.ledger.now()
        if before is None:
            after = bind(
                engine,
                ledger_id,
                self.location,
                now,
                origin=seen.origin,
                origin_host=seen.private_host,
            )
        else:
            after = rebind(
                engine,
                expected=before.ledger_id,
                ledger_id=ledger_id,
                location=self.location,
                now=now,
                origin=seen.origin,
                origin_host=seen.private_host,
            )
        if after.ledger_id != ledger_id:
            raise LedgerMismatch(
                f"another process bound this database to the ledger at {after.location} "
                f"(ledger {after.ledger_id}) meanwhile: nothing was rebound by this command"
            )
        self.ledger.client.set(self.ledger.keys.ledger_id, ledger_id, nx=True)
        for shard in self.ledger.keys.all_shards:
            look = self._look(shard)
            self.ledger.rotate(
                expected_dataset=look.marker or "",
                dataset=look.server_marker,
                epoch=self.new_id(),
                shard=shard.index,
            )
        return before, after

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
        self._keep_freezes()
        _, epoch = self.ledger.rotate(
            expected_dataset=seen.marker or "",
            dataset=seen.server_marker,
            epoch=self.new_id(),
            shard=shard.index,
            seen_epoch=seen.epoch or "",
        )
        return epoch

    def _keep_freezes(self) -> None:
        """Before a new life: the write freezes in force come back from SQL (S13.2), so the
        new life never starts without them (`ledger/freeze.py`). A database that cannot say
        (a schema older than the freeze) leaves that to the sweeper's next try."""
        try:
            reassert(self.ledger, WriteFreezes(self.engine))
        except Exception as e:
            log.warning("could not re-assert the write freezes before a new ledger life: %s", e)
