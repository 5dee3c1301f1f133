"""The reference deployment's order desk and its outcome checks (S2.1, S5.3, S8.1).

The desk records every write under the call's idempotency key: a repeated idempotent write
finds its first effect, and a reconciliation check can tell whether a cancellation happened.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest
from celery import Celery

from dex_celery import Dex, EffectClass, Settings
from dex_celery.examples.orderdesk.tools import register
from reconcile.orders import checks
from tasks.orderdesk import OrderAlreadyCancelled, OrderDesk


@pytest.fixture
def desk(tmp_path: Path) -> OrderDesk:
    return OrderDesk(f"sqlite:///{tmp_path / 'desk.db'}")


def test_orders_are_numbered_from_1001(desk: OrderDesk) -> None:
    first = desk.add_order(customer="Ada", total_cents=100)
    second = desk.add_order(customer="Grace", total_cents=200)
    assert (first.id, second.id) == ("1001", "1002")
    assert desk.get_order("1002").customer == "Grace"


def test_a_note_with_the_same_key_is_added_once(desk: OrderDesk) -> None:
    """S5.3: the idempotency key makes a repeated idempotent write harmless."""
    order = desk.add_order(customer="Ada", total_cents=100)
    first, created = desk.add_note("s/t/c1", order.id, "call back")
    again, created_again = desk.add_note("s/t/c1", order.id, "call back")
    assert created and not created_again
    assert again == first
    assert [op.kind for op in desk.operations("s/t/c1")] == ["note"]


def test_a_cancellation_happens_once_and_is_recorded_under_its_key(desk: OrderDesk) -> None:
    order = desk.add_order(customer="Grace", total_cents=12_950)
    op = desk.cancel("s/t/c2", order.id, "asked")
    assert desk.get_order(order.id).status == "cancelled"
    with pytest.raises(OrderAlreadyCancelled):
        desk.cancel("s/t/c3", order.id, "again")
    assert desk.operations("s/t/c2") == [op]
    assert desk.operations("s/t/c3") == []


def test_outcome_checks_report_what_the_desk_knows(desk: OrderDesk) -> None:
    """S8.1: the check asks the service by key and answers as a note from the application."""
    order = desk.add_order(customer="Grace", total_cents=12_950)
    desk.cancel("s/t/went", order.id, "asked")
    check = checks(desk)["cancel_order"]
    arguments = json.dumps({"order_id": order.id, "reason": "asked"})
    went = asyncio.run(check("s/t/went", arguments))
    assert went.startswith(
        f"Note from the order system: the cancellation of order {order.id} went through"
    )
    did_not = asyncio.run(check("s/t/never", arguments))
    assert "did not go through" in did_not and "safe to cancel it again" in did_not


def test_the_reference_app_registers_one_tool_per_effect_class_and_its_checks(
    tmp_path: Path,
) -> None:
    """S1.2: the example domain covers every effect class; S8.4: the single-attempt tools have
    outcome checks registered with the library."""
    from dex_celery.examples.orderdesk.app import create_app

    settings = Settings(database_url=f"sqlite:///{tmp_path / 'dex.db'}", redis_url="redis://x:1/0")
    app, dex, _desk = create_app(settings)
    effects = {name: tool.policy.effect for name, tool in dex.tools.items()}
    assert effects == {
        "lookup_order": EffectClass.READ,
        "add_order_note": EffectClass.IDEMPOTENT_WRITE,
        "cancel_order": EffectClass.NON_IDEMPOTENT_WRITE,
        "print_shipping_label": None,  # unclassified: nothing declared
    }
    assert dex.outcome_checks.tool_names == {"cancel_order", "print_shipping_label"}
    # The sweeper and the reconcile job both run inside beat (dex_celery.processes.beat).
    assert set(app.conf.beat_schedule) == set()
    assert app.conf.task_routes["dex.tool.print_shipping_label"] == {"queue": "labels"}


def test_the_cancellation_preview_says_what_it_would_do(desk: OrderDesk) -> None:
    """docs/guardrails.md, "Previews": the person deciding reads the order, the customer and
    the refund; the preview only reads the desk."""
    dex = Dex(Celery("orderdesk-preview"), Settings())
    register(dex, desk)
    order = desk.add_order(customer="Ada Lovelace", total_cents=4_200)
    preview = dex.get_tool("cancel_order").preview
    assert preview is not None
    assert preview(order_id=order.id, reason="broken") == (
        "Cancel order 1001 of Ada Lovelace and refund 42.00 by card (reason: broken)"
    )
    assert desk.get_order(order.id).status != "cancelled"
