"""This process's view of the ledger's life id (`KeySpace.epoch`), looked up through the guard."""

from __future__ import annotations

import hashlib
from collections.abc import Callable

from sqlalchemy import Engine

from dex_celery.ledger.guard import LedgerGuard
from dex_celery.ledger.ledger import Ledger
from dex_celery.store.bindings import Binding


class LedgerEpoch:
    """The one place an epoch is looked up and cached (per process: built with the `runtime`).

    Looking it up runs the ledger guard: a Redis that is not this database's ledger raises
    `LedgerMismatch`, and one that went back in time gets a new epoch first.
    """

    def __init__(self, ledger: Ledger, engine: Callable[[], Engine], location: str) -> None:
        self._guard = LedgerGuard(ledger, engine, location)
        self._epoch: str | None = None

    @property
    def location(self) -> str:
        """Where this process's ledger lives (`host:port/db prefix`, `guard.ledger_location`)."""
        return self._guard.location

    def current(self, *, refresh: bool = False) -> str:
        """The epoch in force; `refresh` asks the ledger again (a sweep, an epoch change)."""
        if self._epoch is None or refresh:
            self._epoch = self._guard.check()
        return self._epoch

    def rebind(self) -> tuple[Binding | None, Binding]:
        """Bind the database to this process's ledger (`LedgerGuard.rebind`); the next look
        reads the new life."""
        try:
            return self._guard.rebind()
        finally:
            self._epoch = None

    def recorded(self, epoch: str | None = None) -> str:
        """The epoch as the database records it with a call (`ledger_epoch`, 64 characters at
        most): the epoch itself for a single shard; for a sharded ledger a digest of every
        shard's epoch, so a new life of any shard changes it and an orphan opened before counts
        as possibly run (conservative: it can then never end "did not run")."""
        epoch = self.current() if epoch is None else epoch
        if "," not in epoch:
            return epoch
        return "shards:" + hashlib.sha256(epoch.encode()).hexdigest()[:40]
