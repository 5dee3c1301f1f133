"""Transactions that tell a failed commit from a failure before it.

`engine.begin()` raises the same driver error whether the connection broke while the statements
ran (the transaction provably was not applied: a transaction is applied only by its COMMIT) or
while the COMMIT itself was on the wire (the server may have applied it and the answer was
lost). Two writes need that difference to tell the truth afterwards: a request's insert (its
calls may be recorded, and would then run) and a write's claim (the write fence: the tool runs
only after it). `transaction` raises `CommitUnconfirmed` for the second case only.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from sqlalchemy import Connection, Engine
from sqlalchemy.exc import DBAPIError, InterfaceError, OperationalError

from dex_celery.backend_errors import first_line, safe_url
from dex_celery.errors import CommitUnconfirmed


@contextmanager
def transaction(engine: Engine) -> Iterator[Connection]:
    """`engine.begin()`, except that a connection lost during the COMMIT raises
    `CommitUnconfirmed` (the driver's error is its `__cause__`; past the public API's edge, its
    `cause`: `backend_errors.driver_cause` reads either).

    Anything raised before the COMMIT is sent propagates as it is; the connection is then
    closed without committing, so nothing of the block was applied. An error the server
    answers the COMMIT with (not a lost connection) also propagates as it is: the server
    rolled the transaction back.
    """
    with engine.connect() as conn:
        conn.begin()
        yield conn
        try:
            conn.commit()
        except DBAPIError as e:
            if e.connection_invalidated or isinstance(e, OperationalError | InterfaceError):
                raise CommitUnconfirmed(
                    f"the connection to the database at {safe_url(str(engine.url))} broke "
                    f"while a commit was under way, so whether it was applied is unknown: "
                    f"{first_line(e.orig)}"
                ) from e
            raise
