"""Write budgets as declared and charged (S13.1, S13.1.1): the settings' syntax, what a call
owes from the arguments the tool receives, the texts people and the model read."""

from __future__ import annotations

import pytest

from dex_celery.access import Identity
from dex_celery.errors import ConfigurationError, InvalidId, InvalidToolArguments, PolicyError
from dex_celery.integrations.mcp.server import principal_of
from dex_celery.model.budgets import (
    Budget,
    BudgetScope,
    OverBudget,
    budgets_for,
    charge_of,
    charges_json,
    charges_of_json,
    parse_budgets,
)
from dex_celery.settings import Settings


def test_the_settings_syntax() -> None:
    refunds, spend = parse_budgets(
        "refunds: tools=refund+credit limit=3 label=refunds_made; "
        "spend: tools=refund limit=500 measure=amount_cents scope=principal window=2h over=reject"
    )
    assert refunds == Budget("refunds", 3, tools=("refund", "credit"), label="refunds made")
    assert (spend.scope, spend.window_seconds, spend.over) == (
        BudgetScope.PRINCIPAL,
        7200.0,
        OverBudget.REJECT,
    )
    assert Settings(budgets="x: tools=t limit=1").budget_list == (Budget("x", 1, tools=("t",)),)


@pytest.mark.parametrize(
    "text",
    [
        "refunds tools=a limit=3",  # no colon
        "refunds: tools=a",  # no limit
        "refunds: limit=three",
        "refunds: limit=3 colour=red",
        "Refunds: limit=3",  # not a lowercase name
        "refunds: limit=3 scope=principal",  # a session window needs a session scope
        "refunds: limit=3 window=forever",
        "a: limit=1; a: limit=2",
    ],
)
def test_a_bad_declaration_is_refused(text: str) -> None:
    with pytest.raises(PolicyError):
        parse_budgets(text)


def test_budgets_need_one_shard() -> None:
    with pytest.raises(ConfigurationError, match="one shard"):
        Settings(budgets="a: limit=1", ledger_shards=2)


def test_the_settings_replace_a_policy_budget_by_name() -> None:
    declared = (Budget("refunds", 3), Budget("other", 1))
    configured = (Budget("refunds", 10, tools=("x",)), Budget("spend", 5, tools=("refund",)))
    assert budgets_for("refund", declared, configured) == (
        Budget("other", 1),
        Budget("refunds", 10, tools=("x",)),
        Budget("spend", 5, tools=("refund",)),
    )
    assert budgets_for("elsewhere", (), configured) == ()


def test_a_charge_is_taken_from_the_received_arguments() -> None:
    spend = Budget("spend", 500, measure="amount_cents", scope=BudgetScope.PRINCIPAL, window="day")
    charge = charge_of(
        spend, {"amount_cents": 120}, session_id="s1", principal="acme", tool_name="refund"
    )
    assert (charge.amount, charge.scope_id, charge.window) == (120, "principal:acme", 86400.0)
    assert charges_of_json(charges_json([charge])) == (charge,)
    for bad in (True, -1, 1.5, "120", None):
        with pytest.raises(InvalidToolArguments):
            charge_of(
                spend, {"amount_cents": bad}, session_id="s1", principal="acme", tool_name="t"
            )
    with pytest.raises(InvalidToolArguments, match="pass the request's principal"):
        charge_of(spend, {"amount_cents": 1}, session_id="s1", principal=None, tool_name="t")
    with pytest.raises(InvalidId):
        charge_of(spend, {"amount_cents": 1}, session_id="s1", principal="a/b", tool_name="t")


def test_the_texts_people_and_the_model_read() -> None:
    count = charge_of(Budget("refunds", 3), {}, session_id="s1", principal=None, tool_name="t")
    assert count.over_text(2, 1) == (
        "3 of 3 refunds in this session already used or in doubt; this call needs 1 more"
    )
    spend = Budget(
        "spend", 500, measure="amount_cents", scope=BudgetScope.DEPLOYMENT, window="hour"
    )
    cents = charge_of(spend, {"amount_cents": 90}, session_id="s", principal=None, tool_name="t")
    assert cents.over_text(450, 0) == (
        "450 of 500 amount_cents (spend) in this deployment in the last hour already used or in "
        "doubt; this call needs 90 more"
    )


def test_the_mcp_principal_is_the_identity_or_its_digest() -> None:
    def identity(name: str) -> Identity:
        return Identity(name=name)

    assert principal_of(identity("alice")) == "alice"
    odd = principal_of(identity("a/b{c}"))
    assert odd.startswith("id-") and len(odd) == 19
