"""The order desk: a small service of its own that the example tools write to.

It lives in the same database as dex-celery (same URL) but in its own tables, which it creates
itself: it stands for the business system a real deployment already has. What matters for
dex-celery is that every write records the idempotency key it was given (S2.1), so that

- a retried `idempotent_write` finds its earlier effect and does nothing more (S5.3), and
- reconciliation can ask "did the operation with this key happen?" (S8.1).

The refund a cancellation triggers goes to a payment provider that takes no idempotency key:
that is why `cancel_order` is a `non_idempotent_write` and runs at most once.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from sqlalchemy import (
    Column,
    Connection,
    Engine,
    Float,
    Index,
    Integer,
    MetaData,
    RowMapping,
    String,
    Table,
    Text,
    insert,
    select,
    update,
)
from sqlalchemy.exc import IntegrityError, OperationalError, ProgrammingError

from dex_celery.store.sql_engine import EngineHandle

metadata = MetaData()

orders = Table(
    "orderdesk_orders",
    metadata,
    Column("id", String(32), primary_key=True),
    Column("customer", String(200), nullable=False),
    Column("status", String(16), nullable=False),  # open | cancelled
    Column("total_cents", Integer, nullable=False),
    Column("payment", String(32), nullable=False),  # card | bank_transfer
    # How long the payment provider takes to confirm a refund of this order (bank transfers
    # are slow); the window in which the demo kills the worker.
    Column("refund_seconds", Float, nullable=False, default=0.0),
)

notes = Table(
    "orderdesk_notes",
    metadata,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("idempotency_key", String(620), nullable=False, unique=True),
    Column("order_id", String(32), nullable=False),
    Column("text", Text, nullable=False),
    Column("created_at", Float, nullable=False),
)

cancellations = Table(
    "orderdesk_cancellations",
    metadata,
    Column("id", Integer, primary_key=True, autoincrement=True),
    # Recorded, but not unique: the refund behind a cancellation is not deduplicated.
    Column("idempotency_key", String(620), nullable=False),
    Column("order_id", String(32), nullable=False),
    Column("reason", Text, nullable=False),
    Column("refund_cents", Integer, nullable=False),
    Column("created_at", Float, nullable=False),
    Index("ix_orderdesk_cancellations_key", "idempotency_key"),
)

labels = Table(
    "orderdesk_labels",
    metadata,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("idempotency_key", String(620), nullable=False),
    Column("order_id", String(32), nullable=False),
    Column("created_at", Float, nullable=False),
    Index("ix_orderdesk_labels_key", "idempotency_key"),
)

FIRST_ORDER_NUMBER = 1001

#: Orders the demo and the tests start from.
DEMO_ORDERS: tuple[dict[str, object], ...] = (
    {"customer": "Ada Lovelace", "total_cents": 4_200, "payment": "card", "refund_seconds": 0.0},
    {
        "customer": "Grace Hopper",
        "total_cents": 12_950,
        "payment": "bank_transfer",
        "refund_seconds": 60.0,
    },
    {"customer": "Alan Turing", "total_cents": 990, "payment": "card", "refund_seconds": 0.0},
)


class OrderNotFound(LookupError):
    """No order with this id."""


class OrderAlreadyCancelled(RuntimeError):
    """The order was cancelled before."""


@dataclass(frozen=True, slots=True)
class Order:
    id: str
    customer: str
    status: str
    total_cents: int
    payment: str
    refund_seconds: float


@dataclass(frozen=True, slots=True)
class Operation:
    """One write the desk recorded under an idempotency key."""

    kind: str  # note | cancellation | label
    order_id: str
    idempotency_key: str
    created_at: float
    detail: str


class OrderDesk:
    """The service. Thread-safe; its engine is re-made after a fork (prefork children)."""

    def __init__(self, url: str, *, clock: Callable[[], float] = time.time) -> None:
        self.url = url
        self.clock = clock
        self._engine = EngineHandle(url, on_create=_create_tables)

    @property
    def engine(self) -> Engine:
        return self._engine.get()

    # --- orders --------------------------------------------------------------------------------

    def add_order(
        self,
        *,
        customer: str,
        total_cents: int,
        payment: str = "card",
        refund_seconds: float = 0.0,
        order_id: str | None = None,
    ) -> Order:
        """Open an order; without `order_id` it gets the next free number from 1001 on."""
        for _ in range(5):
            try:
                with self.engine.begin() as conn:
                    number = order_id or _next_number(conn)
                    values = dict(
                        id=number,
                        customer=customer,
                        status="open",
                        total_cents=total_cents,
                        payment=payment,
                        refund_seconds=refund_seconds,
                    )
                    conn.execute(insert(orders).values(**values))
                return _order(values)
            except IntegrityError:
                if order_id is not None:
                    raise
        raise RuntimeError("could not allocate an order number")

    def get_order(self, order_id: str) -> Order:
        with self.engine.connect() as conn:
            row = conn.execute(select(orders).where(orders.c.id == order_id)).mappings().first()
        if row is None:
            raise OrderNotFound(f"there is no order {order_id}")
        return _order(row)

    # --- writes, each recording the idempotency key --------------------------------------------

    def add_note(self, key: str, order_id: str, text: str) -> tuple[Operation, bool]:
        """Idempotent: a second call with the same key returns the first note. (note, created)."""
        self.get_order(order_id)
        existing = self._note(key)
        if existing is not None:
            return existing, False
        try:
            with self.engine.begin() as conn:
                conn.execute(
                    insert(notes).values(
                        idempotency_key=key, order_id=order_id, text=text, created_at=self.clock()
                    )
                )
        except IntegrityError:  # a concurrent attempt with the same key won
            pass
        note = self._note(key)
        assert note is not None
        return note, True

    def cancel(self, key: str, order_id: str, reason: str) -> Operation:
        """Mark the order cancelled and record the cancellation (with the key) in one step."""
        now = self.clock()
        with self.engine.begin() as conn:
            row = conn.execute(select(orders).where(orders.c.id == order_id)).mappings().first()
            if row is None:
                raise OrderNotFound(f"there is no order {order_id}")
            changed = conn.execute(
                update(orders)
                .where(orders.c.id == order_id)
                .where(orders.c.status == "open")
                .values(status="cancelled")
            ).rowcount
            if changed != 1:
                raise OrderAlreadyCancelled(f"order {order_id} is cancelled already")
            conn.execute(
                insert(cancellations).values(
                    idempotency_key=key,
                    order_id=order_id,
                    reason=reason,
                    refund_cents=row["total_cents"],
                    created_at=now,
                )
            )
        return Operation("cancellation", order_id, key, now, reason)

    def print_label(self, key: str, order_id: str) -> Operation:
        self.get_order(order_id)
        now = self.clock()
        with self.engine.begin() as conn:
            conn.execute(
                insert(labels).values(idempotency_key=key, order_id=order_id, created_at=now)
            )
        return Operation("label", order_id, key, now, "")

    # --- what reconciliation asks --------------------------------------------------------------

    def operations(self, key: str) -> list[Operation]:
        """Every write recorded under `key`, oldest first (S8.1)."""
        found: list[Operation] = []
        with self.engine.connect() as conn:
            for row in conn.execute(
                select(cancellations).where(cancellations.c.idempotency_key == key)
            ).mappings():
                found.append(
                    Operation(
                        "cancellation", row["order_id"], key, row["created_at"], row["reason"]
                    )
                )
            for row in conn.execute(
                select(labels).where(labels.c.idempotency_key == key)
            ).mappings():
                found.append(Operation("label", row["order_id"], key, row["created_at"], ""))
        note = self._note(key)
        if note is not None:
            found.append(note)
        return sorted(found, key=lambda op: op.created_at)

    def _note(self, key: str) -> Operation | None:
        with self.engine.connect() as conn:
            row = (
                conn.execute(select(notes).where(notes.c.idempotency_key == key)).mappings().first()
            )
        if row is None:
            return None
        return Operation("note", row["order_id"], key, row["created_at"], row["text"])


def _create_tables(engine: Engine) -> None:
    """The desk owns its tables; several processes may race to create them at start."""
    for _ in range(5):
        try:
            metadata.create_all(engine, checkfirst=True)
            return
        except (OperationalError, ProgrammingError, IntegrityError):
            time.sleep(0.1)  # another process created them between the check and the create
    metadata.create_all(engine, checkfirst=True)


def _next_number(conn: Connection) -> str:
    ids = conn.execute(select(orders.c.id)).scalars()
    numbers = [int(i) for i in ids if str(i).isdigit()]
    return str(max(numbers, default=FIRST_ORDER_NUMBER - 1) + 1)


def _order(row: RowMapping | Mapping[str, Any]) -> Order:
    return Order(
        id=str(row["id"]),
        customer=str(row["customer"]),
        status=str(row["status"]),
        total_cents=int(row["total_cents"]),
        payment=str(row["payment"]),
        refund_seconds=float(row["refund_seconds"] or 0.0),
    )
