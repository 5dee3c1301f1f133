"""What the store's aggregates share: this process's engine and the clock of SQL times."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from sqlalchemy import Engine

if TYPE_CHECKING:
    from dex_celery.audit.chain import AuditLog


class StoreBase:
    """The base of `CallRecords` and `SessionsAndMessages`; `Store` provides both members."""

    #: SQL times (requests, deadlines, outcomes) come from the ledger's clock (S10.1).
    clock: Callable[[], float]
    #: The audit log every decision is appended to, in the transaction that makes it (S13.4).
    audit: AuditLog

    @property
    def engine(self) -> Engine:
        raise NotImplementedError
