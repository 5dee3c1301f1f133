"""Outcome checks for the order desk's tools (S8.1).

A check gets the idempotency key of a call whose outcome is unknown and the call's arguments as
JSON, asks the desk whether an operation with that key exists, and returns the report the
session will read, written as a note from the application.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable

from dex_celery.examples.orderdesk.desk import Operation, OrderDesk
from dex_celery.model.times import format_utc

#: `(idempotency key, tool arguments as JSON) -> report text`, the seed's `OutcomeCheck`.
OutcomeCheck = Callable[[str, str], Awaitable[str]]


def _order_id(arguments: str) -> str:
    try:
        value = json.loads(arguments or "{}")
    except ValueError:
        return "?"
    return str(value.get("order_id", "?")) if isinstance(value, dict) else "?"


def cancellation_check(desk: OrderDesk) -> OutcomeCheck:
    """Did the cancellation with this key go through?"""

    async def check(key: str, arguments: str) -> str:
        ops = await asyncio.to_thread(desk.operations, key)
        order_id = _order_id(arguments)
        done = [op for op in ops if op.kind == "cancellation"]
        if done:
            return (
                f"Note from the order system: the cancellation of order {done[0].order_id} "
                f"went through ({_when(done[0])})."
            )
        return (
            f"Note from the order system: the cancellation of order {order_id} did not go "
            "through; the order is unchanged and it is safe to cancel it again."
        )

    return check


def label_check(desk: OrderDesk) -> OutcomeCheck:
    """Was the label with this key printed?"""

    async def check(key: str, arguments: str) -> str:
        ops = await asyncio.to_thread(desk.operations, key)
        order_id = _order_id(arguments)
        if any(op.kind == "label" for op in ops):
            return f"Note from the warehouse: the shipping label of order {order_id} was printed."
        return (
            f"Note from the warehouse: the shipping label of order {order_id} was not printed; "
            "it is safe to print it again."
        )

    return check


def checks(desk: OrderDesk) -> dict[str, OutcomeCheck]:
    """Tool name -> outcome check, for every order-desk tool that can end `outcome_unknown`.

    `lookup_order` never does (a read ends `failed`), and `add_order_note` is retried until it
    succeeds or fails; only the single-attempt tools need a check.
    """
    return {"cancel_order": cancellation_check(desk), "print_shipping_label": label_check(desk)}


def _when(op: Operation) -> str:
    return "recorded " + format_utc(op.created_at, millis=False)
