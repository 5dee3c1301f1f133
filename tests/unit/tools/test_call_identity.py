"""What counts as "the same call" (docs/semantics.md S12.2), against `tools/call_identity.py`.

The oracle is what the tool itself receives: the worker's argument check
(`arguments.check_arguments`), then Python's own binding of the function's defaults. Two requests
must share a fingerprint exactly when the tool would receive the same values of the same types.
"""

from __future__ import annotations

import inspect
import json
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dex_celery.errors import InvalidToolArguments, SecretKeyMissing
from dex_celery.integrations.frameworks.calls import same_arguments
from dex_celery.model.policy import ToolPolicy
from dex_celery.tools.arguments import check_arguments, prepare_tool
from dex_celery.tools.call_identity import identify, identity_text
from dex_celery.tools.tool import Tool

KEY = "unit-test-key"


def charge(
    ctx: Any,
    order: str,
    amount: int,
    memo: str | None = None,
    seconds: float = 0.0,
    urgent: bool = False,
    tags: list[int] | None = None,
    card: str = "none",
) -> None:
    """The test's tool: every argument type the property below spells in several ways."""


CHARGE = prepare_tool(Tool("charge", charge, ToolPolicy(secret_arguments=("card",))))

SCHEMA_TOOL = prepare_tool(
    Tool(
        "remote_charge",
        charge,
        ToolPolicy(),
        input_schema={
            "type": "object",
            "properties": {
                "order": {"type": "string"},
                "amount": {"type": "integer"},
                "memo": {"type": ["string", "null"], "default": None},
                "seconds": {"type": "number", "default": 0},
            },
            "required": ["order", "amount"],
            "additionalProperties": False,
        },
    )
)


def received(arguments: dict[str, Any]) -> dict[str, Any]:
    """What the tool receives: the worker's check, then the function's defaults bound."""
    bound = inspect.signature(charge).bind(None, **check_arguments(CHARGE, arguments))
    bound.apply_defaults()
    out = dict(bound.arguments)
    out.pop("ctx")
    return out


def typed(value: Any) -> Any:
    """Equality that sees types (`1 == True == 1.0` in Python, not for the tool)."""
    if isinstance(value, dict):
        return {k: typed(v) for k, v in value.items()}
    if isinstance(value, list):
        return [typed(v) for v in value]
    return (type(value).__name__, value)


OMIT = object()

#: Small pools so that equal meanings spelled differently are drawn often.
SPELLINGS: dict[str, list[Any]] = {
    "order": ["A-1", "A-2"],
    "amount": [1, 1.0, "1", True, 2, 2.0, "2", " 2 "],
    "memo": [OMIT, None, "x", "y"],
    "seconds": [OMIT, 0, 0.0, "0", 0.5, "0.5", 1, 1.0],
    "urgent": [OMIT, False, True, 0, 1, "true", "false"],
    "tags": [OMIT, None, [], [1], [1.0], ["1"], [2]],
    "card": [OMIT, "none", "4111 1111", "4222 2222"],
}

requests = st.fixed_dictionaries({name: st.sampled_from(pool) for name, pool in SPELLINGS.items()})


def spelled(drawn: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in drawn.items() if v is not OMIT}


@settings(max_examples=400, deadline=None)
@given(requests, requests)
def test_same_fingerprint_exactly_when_the_tool_receives_the_same_values(
    first: dict[str, Any], second: dict[str, Any]
) -> None:
    a, b = spelled(first), spelled(second)
    same = typed(received(a)) == typed(received(b))
    assert (identify(CHARGE, a, KEY).fingerprint == identify(CHARGE, b, KEY).fingerprint) is same
    shown_same = typed({**received(a), "card": "***"}) == typed({**received(b), "card": "***"})
    assert (identity_text(CHARGE, a) == identity_text(CHARGE, b)) is shown_same


@settings(max_examples=200, deadline=None)
@given(requests)
def test_key_order_and_spacing_never_count(drawn: dict[str, Any]) -> None:
    arguments = spelled(drawn)
    reordered = json.loads(json.dumps(dict(reversed(list(arguments.items()))), indent=3))
    assert identify(CHARGE, reordered, KEY) == identify(CHARGE, arguments, KEY)


def test_the_issue_variations_are_one_call_and_other_values_are_not() -> None:
    base = identify(CHARGE, {"order": "A", "amount": 10}, KEY).fingerprint
    for same in (
        {"order": "A", "amount": 10.0},
        {"order": "A", "amount": "10"},
        {"order": "A", "amount": 10, "memo": None},
        {"order": "A", "amount": 10, "seconds": 0.0},
        {"amount": 10, "order": "A", "card": "none"},
    ):
        assert identify(CHARGE, same, KEY).fingerprint == base, same
    one = identify(CHARGE, {"order": "A", "amount": 1}, KEY).fingerprint
    assert identify(CHARGE, {"order": "A", "amount": True}, KEY).fingerprint == one
    for other in (
        {"order": "A", "amount": 11},
        {"order": "B", "amount": 10},
        {"order": "A", "amount": 10, "memo": ""},
        {"order": "A", "amount": 10, "seconds": 0.1},
        {"order": "A", "amount": 10, "card": "4111"},
    ):
        assert identify(CHARGE, other, KEY).fingerprint != base, other


def test_secrets_stay_out_of_the_text_and_need_the_key_only_when_given() -> None:
    given_card = identify(CHARGE, {"order": "A", "amount": 1, "card": "4111 1111"}, KEY)
    assert "4111" not in given_card.text and '"card":"***"' in given_card.text
    other_key = identify(CHARGE, {"order": "A", "amount": 1, "card": "4111 1111"}, "other")
    assert other_key.fingerprint != given_card.fingerprint
    # Only the tool's own default: no secret of the caller's, so no key is needed.
    assert identify(CHARGE, {"order": "A", "amount": 1}, None).text == given_card.text
    with pytest.raises(SecretKeyMissing):
        identify(CHARGE, {"order": "A", "amount": 1, "card": "4111 1111"}, None)


def test_arguments_the_check_refuses_are_refused_with_its_words() -> None:
    with pytest.raises(InvalidToolArguments, match="argument 'amount'"):
        identify(CHARGE, {"order": "A", "amount": 10.5}, KEY)
    with pytest.raises(InvalidToolArguments, match="unexpected argument 'amout'"):
        identify(CHARGE, {"order": "A", "amout": 10}, KEY)


def test_schema_tools_fill_defaults_and_compare_numbers_as_json_schema_does() -> None:
    base = identify(SCHEMA_TOOL, {"order": "A", "amount": 10}, KEY).fingerprint
    for same in (
        {"order": "A", "amount": 10.0},
        {"order": "A", "amount": 10, "memo": None},
        {"order": "A", "amount": 10, "seconds": 0.0},
    ):
        assert identify(SCHEMA_TOOL, same, KEY).fingerprint == base, same
    assert identify(SCHEMA_TOOL, {"order": "A", "amount": 10, "memo": "m"}, KEY).fingerprint != (
        base
    )
    # JSON Schema does not coerce: a string or a boolean for an integer is refused.
    for refused in ({"order": "A", "amount": "10"}, {"order": "A", "amount": True}):
        with pytest.raises(InvalidToolArguments):
            identify(SCHEMA_TOOL, refused, KEY)


def test_a_fully_spelled_call_keeps_its_stored_text() -> None:
    """Fingerprints written before S12.2 hash the stored text: a request spelling every
    argument in its received form still meets them (docs/semantics.md S12.2)."""
    arguments = {
        "amount": 10,
        "card": "***",
        "memo": None,
        "order": "A",
        "seconds": 0.0,
        "tags": None,
        "urgent": False,
    }
    stored = json.dumps(arguments, sort_keys=True, separators=(",", ":"))
    assert identity_text(CHARGE, arguments) == stored


def test_framework_approvals_compare_json_values() -> None:
    assert same_arguments({"amount": 10, "memo": None}, {"memo": None, "amount": 10.0})
    assert not same_arguments({"amount": 1}, {"amount": True})
    assert not same_arguments({"amount": 10}, {"amount": 11})
