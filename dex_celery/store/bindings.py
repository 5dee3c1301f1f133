"""The database's record of which ledger it belongs to (one row, `dex_ledger_binding`).

The row also says what kind of Redis held that ledger (`LedgerOrigin`), because that decides
what may happen when the ledger is gone: a private Redis that `dex-celery dev` or `demo` started
for itself is gone for good once its stack stops, so the next stack on the same database may
start a new ledger by itself; a configured Redis may only be out of reach for a while, so a
process elsewhere keeps refusing until an operator rebinds (docs/ledger.md, "One database, one
ledger").
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum

from sqlalchemy import Engine, delete, insert, select, update
from sqlalchemy.exc import IntegrityError

from dex_celery.store.schema import ledger_bindings

_ROW = 1


class LedgerOrigin(Enum):
    """What kind of Redis held the bound ledger."""

    #: A Redis the deployment's settings name (`DEX_REDIS_URL`): it outlives any one process.
    CONFIGURED = "configured"
    #: A redis-server `dex-celery dev` or `demo` started for itself, on loopback, in a
    #: temporary folder removed when the stack stops: nothing else can hold that ledger.
    PRIVATE = "private"


@dataclass(frozen=True, slots=True)
class Binding:
    ledger_id: str
    #: Where the bound ledger lives (`host:port/db prefix`), as the first process saw it.
    location: str
    bound_at: float
    origin: LedgerOrigin = LedgerOrigin.CONFIGURED
    #: The host whose `dev`/`demo` started the private Redis (None for a configured one).
    origin_host: str | None = None


def read_binding(engine: Engine) -> Binding | None:
    with engine.connect() as conn:
        row = conn.execute(select(ledger_bindings).where(ledger_bindings.c.id == _ROW)).first()
    if row is None:
        return None
    return Binding(
        row.ledger_id,
        row.location,
        row.bound_at,
        _origin(row.origin),
        row.origin_host,
    )


def _origin(stored: str | None) -> LedgerOrigin:
    """A value this release does not know (a newer one's) counts as configured: the careful
    reading, which never rebinds by itself."""
    try:
        return LedgerOrigin(stored)
    except ValueError:
        return LedgerOrigin.CONFIGURED


def bind(
    engine: Engine,
    ledger_id: str,
    location: str,
    now: float,
    *,
    origin: LedgerOrigin = LedgerOrigin.CONFIGURED,
    origin_host: str | None = None,
) -> Binding:
    """Bind the database to `ledger_id` unless it is bound already; returns the binding in force.

    Two first processes may race: the primary key makes one insert win, the other reads it.
    """
    try:
        with engine.begin() as conn:
            conn.execute(
                insert(ledger_bindings).values(
                    id=_ROW,
                    ledger_id=ledger_id,
                    location=location,
                    bound_at=now,
                    origin=origin.value,
                    origin_host=origin_host,
                )
            )
    except IntegrityError:
        pass
    binding = read_binding(engine)
    assert binding is not None  # inserted above, or by the process that won the race
    return binding


def rebind(
    engine: Engine,
    *,
    expected: str,
    ledger_id: str,
    location: str,
    now: float,
    origin: LedgerOrigin,
    origin_host: str | None = None,
) -> Binding:
    """Bind the database to another ledger, if it is still bound to `expected` (compare-and-set:
    of processes that notice the same gone ledger at once, one rebinds and the others read
    its binding; a binding released meanwhile is bound afresh). Returns the binding in force
    afterwards."""
    with engine.begin() as conn:
        conn.execute(
            update(ledger_bindings)
            .where(ledger_bindings.c.id == _ROW, ledger_bindings.c.ledger_id == expected)
            .values(
                ledger_id=ledger_id,
                location=location,
                bound_at=now,
                origin=origin.value,
                origin_host=origin_host,
            )
        )
    # Released meanwhile (`release_binding`): nothing to compare with, so bind as a first process does.
    return read_binding(engine) or bind(
        engine, ledger_id, location, now, origin=origin, origin_host=origin_host
    )


def release_binding(engine: Engine, *, expected: str) -> bool:
    """Forget the ledger the database belongs to, if it is still `expected` (compare-and-set);
    the next process to look binds it to the ledger of its own Redis. Returns whether this call
    removed the binding."""
    with engine.begin() as conn:
        removed = conn.execute(
            delete(ledger_bindings).where(
                ledger_bindings.c.id == _ROW, ledger_bindings.c.ledger_id == expected
            )
        ).rowcount
    return bool(removed)
