"""The order desk's tools: one of each effect class (S1.2).

| tool                   | effect class           | approval | why that class                               |
|------------------------|------------------------|----------|----------------------------------------------|
| `lookup_order`         | `read`                 | no       | reads only                                   |
| `add_order_note`       | `idempotent_write`     | no       | the desk stores the key; a repeat is a no-op |
| `cancel_order`         | `non_idempotent_write` | yes      | the refund it triggers cannot be deduplicated|

`cancel_order` has a preview: the person deciding reads "Cancel order 1001 of Ada Lovelace and
refund 42.00 by card (reason: ...)" on the approval page, in `approvals list` and in the webhook.
| `print_shipping_label` | `unclassified`         | no       | nobody has said; runs at most once           |

Every tool passes `ctx.idempotency_key` to the desk, which is what lets reconciliation ask the
desk what really happened (S8.1) and makes a double run of an idempotent write harmless (S5.3).

`print_shipping_label` runs on the `labels` queue, served by the warehouse's label-printer
workers (the compose file's `worker` consumes it; `dex-celery dev` does not), and a label is
only worth printing within seconds: with no printer worker its attempt expires in the queue and
the call is `failed` with the did-not-run error (S4.2).
"""

from __future__ import annotations

import time
from typing import Any

from dex_celery import (
    Dex,
    EffectClass,
    RetryableToolError,
    ToolContext,
    ToolError,
    ToolPolicy,
)
from dex_celery.examples.orderdesk.desk import OrderAlreadyCancelled, OrderDesk, OrderNotFound
from dex_celery.tools.tool import TASK_PREFIX

#: The queue of the label printers (see the module docstring).
LABELS_QUEUE = "labels"
#: Celery's default queue, where every other tool runs.
DEFAULT_QUEUE = "celery"
#: A label not printed within this many seconds of the request is not printed at all.
LABEL_SCHEDULE_TO_START = 4.0
#: Cancellations wait for a person's decision for at most this long.
CANCEL_APPROVAL_TIMEOUT = 3600.0


def task_routes() -> dict[str, dict[str, str]]:
    """`app.conf.task_routes` for these tools."""
    return {TASK_PREFIX + "print_shipping_label": {"queue": LABELS_QUEUE}}


def register(dex: Dex, desk: OrderDesk) -> None:
    """Register the order desk's tools on `dex`, writing to `desk`."""

    @dex.tool(policy=ToolPolicy(effect=EffectClass.READ))
    def lookup_order(ctx: ToolContext, order_id: str) -> dict[str, Any]:
        """Look up an order: customer, status, total and payment method."""
        try:
            order = desk.get_order(order_id)
        except OrderNotFound as e:
            raise ToolError(str(e)) from e
        except ConnectionError as e:  # the desk's database is briefly away: try again
            raise RetryableToolError(f"the order desk did not answer: {e}") from e
        return {
            "order_id": order.id,
            "customer": order.customer,
            "status": order.status,
            "total": f"{order.total_cents / 100:.2f}",
            "payment": order.payment,
        }

    @dex.tool(policy=ToolPolicy(effect=EffectClass.IDEMPOTENT_WRITE))
    def add_order_note(ctx: ToolContext, order_id: str, note: str) -> dict[str, Any]:
        """Add a note to an order. Retried safely: the desk keeps one note per idempotency key."""
        try:
            op, created = desk.add_note(ctx.idempotency_key, order_id, note)
        except OrderNotFound as e:
            raise ToolError(str(e)) from e
        return {"order_id": op.order_id, "note": op.detail, "already_added": not created}

    def cancel_preview(order_id: str, reason: str) -> str:
        """What the person approving a cancellation reads (docs/guardrails.md, "Previews"):
        a read of the desk, run on a worker while the call waits."""
        order = desk.get_order(order_id)
        return (
            f"Cancel order {order.id} of {order.customer} and refund "
            f"{order.total_cents / 100:.2f} by {order.payment.replace('_', ' ')} (reason: {reason})"
        )

    @dex.tool(
        policy=ToolPolicy(
            effect=EffectClass.NON_IDEMPOTENT_WRITE, approval_timeout=CANCEL_APPROVAL_TIMEOUT
        ),
        preview=cancel_preview,
    )
    def cancel_order(ctx: ToolContext, order_id: str, reason: str) -> dict[str, Any]:
        """Cancel an order and refund the customer. Needs a person's approval; runs at most once."""
        try:
            op = desk.cancel(ctx.idempotency_key, order_id, reason)
            order = desk.get_order(order_id)
        except (OrderNotFound, OrderAlreadyCancelled) as e:
            raise ToolError(str(e)) from e
        _refund(ctx, order.refund_seconds)
        return {
            "order_id": op.order_id,
            "status": "cancelled",
            "refunded": f"{order.total_cents / 100:.2f}",
        }

    @dex.tool(policy=ToolPolicy(requires_approval=False, schedule_to_start=LABEL_SCHEDULE_TO_START))
    def print_shipping_label(ctx: ToolContext, order_id: str) -> dict[str, Any]:
        """Print the shipping label of an order on the warehouse printer."""
        try:
            desk.print_label(ctx.idempotency_key, order_id)
        except OrderNotFound as e:
            raise ToolError(str(e)) from e
        return {"order_id": order_id, "printed": True}


def _refund(ctx: ToolContext, seconds: float) -> None:
    """The payment provider's refund call (simulated): a bank transfer takes a while.

    The tool heartbeats while it waits, and stops waiting once the system has fenced the attempt.
    """
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if not ctx.heartbeat():
            return
        time.sleep(min(0.2, max(0.0, deadline - time.monotonic())))
