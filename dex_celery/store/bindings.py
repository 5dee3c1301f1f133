"""The database's record of which ledger it belongs to (one row, `dex_ledger_binding`)."""

from __future__ import annotations

from dataclasses import dataclass

from sqlalchemy import Engine, insert, select
from sqlalchemy.exc import IntegrityError

from dex_celery.store.schema import ledger_bindings

_ROW = 1


@dataclass(frozen=True, slots=True)
class Binding:
    ledger_id: str
    #: Where the bound ledger lives (`host:port/db prefix`), as the first process saw it.
    location: str
    bound_at: float


def read_binding(engine: Engine) -> Binding | None:
    with engine.connect() as conn:
        row = conn.execute(select(ledger_bindings).where(ledger_bindings.c.id == _ROW)).first()
    return None if row is None else Binding(row.ledger_id, row.location, row.bound_at)


def bind(engine: Engine, ledger_id: str, location: str, now: float) -> Binding:
    """Bind the database to `ledger_id` unless it is bound already; returns the binding in force.

    Two first processes may race: the primary key makes one insert win, the other reads it.
    """
    try:
        with engine.begin() as conn:
            conn.execute(
                insert(ledger_bindings).values(
                    id=_ROW, ledger_id=ledger_id, location=location, bound_at=now
                )
            )
    except IntegrityError:
        pass
    binding = read_binding(engine)
    assert binding is not None  # inserted above, or by the process that won the race
    return binding
