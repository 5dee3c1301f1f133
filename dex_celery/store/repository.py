"""The system of record: `Store`, one object over the aggregates kept in SQL.

`CallRecords` (`store/calls.py`) holds the tool-call records, `SessionsAndMessages`
(`store/sessions.py`) the sessions and their history; value types are in `store/values.py`, row
mapping in `store/rows.py`, dialect differences in `store/dialect.py`, the hot path's statements
compiled once in `store/hot.py`. The store only persists: what a call's status or deadline
should be is decided by the dispatcher and the approvals.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from sqlalchemy import Engine

from dex_celery.audit.chain import AuditLog
from dex_celery.audit.keys import Signer
from dex_celery.store.approval_binding import ApprovalBinding
from dex_celery.store.budgets import BudgetRecords
from dex_celery.store.calls import CallRecords
from dex_celery.store.schema import metadata
from dex_celery.store.sessions import SessionsAndMessages
from dex_celery.store.sql_engine import EngineHandle


class Store(CallRecords, SessionsAndMessages, ApprovalBinding, BudgetRecords):
    """Repository over one database. Safe to share between threads; re-made after a fork."""

    def __init__(
        self,
        url: str,
        *,
        clock: Callable[[], float] = time.time,
        schema: str | None = None,
        signer: Signer | None = None,
    ) -> None:
        self.url = url
        self.clock = clock
        #: PostgreSQL schema of the tables (`Settings.database_schema`); None: the default one.
        self.schema = schema
        self._engine = EngineHandle(url, schema=schema)
        #: Entries are timed by the store's clock, the ledger's (S10.1), as the records are.
        self.audit = AuditLog(lambda: self.engine, signer, clock=lambda: self.clock())

    @property
    def engine(self) -> Engine:
        return self._engine.get()

    def create_schema(self) -> None:
        """For tests and the embedded demo; production runs `dex-celery db upgrade` (Alembic)."""
        metadata.create_all(self.engine)
