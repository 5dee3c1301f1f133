"""The order desk service (not installed; see `dex_celery.examples.orderdesk.desk`)."""

from __future__ import annotations

from dex_celery.examples.orderdesk.desk import (
    DEMO_ORDERS,
    Operation,
    Order,
    OrderAlreadyCancelled,
    OrderDesk,
    OrderNotFound,
)

__all__ = [
    "DEMO_ORDERS",
    "Operation",
    "Order",
    "OrderAlreadyCancelled",
    "OrderDesk",
    "OrderNotFound",
]
