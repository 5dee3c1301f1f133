"""This process's view of the ledger's life id (`KeySpace.epoch`), looked up through the guard."""

from __future__ import annotations

from collections.abc import Callable

from sqlalchemy import Engine

from dex_celery.ledger.guard import LedgerGuard
from dex_celery.ledger.ledger import Ledger


class LedgerEpoch:
    """The one place an epoch is looked up and cached (per process: built with the `runtime`).

    Looking it up runs the ledger guard: a Redis that is not this database's ledger raises
    `LedgerMismatch`, and one that went back in time gets a new epoch first.
    """

    def __init__(self, ledger: Ledger, engine: Callable[[], Engine], location: str) -> None:
        self._guard = LedgerGuard(ledger, engine, location)
        self._epoch: str | None = None

    def current(self, *, refresh: bool = False) -> str:
        """The epoch in force; `refresh` asks the ledger again (a sweep, an epoch change)."""
        if self._epoch is None or refresh:
            self._epoch = self._guard.check()
        return self._epoch
