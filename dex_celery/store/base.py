"""What the store's aggregates share: this process's engine and the clock of SQL times."""

from __future__ import annotations

from collections.abc import Callable

from sqlalchemy import Engine


class StoreBase:
    """The base of `CallRecords` and `SessionsAndMessages`; `Store` provides both members."""

    #: SQL times (requests, deadlines, outcomes) come from the ledger's clock (S10.1).
    clock: Callable[[], float]

    @property
    def engine(self) -> Engine:
        raise NotImplementedError
