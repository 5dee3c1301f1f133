"""Argument schemas from signatures, tool definitions, sealing and scrubbing (issue 11)."""

from __future__ import annotations

import asyncio
import json
from decimal import Decimal
from enum import StrEnum
from typing import Annotated, Any, Literal

import pytest
from celery import Celery
from pydantic import BaseModel, Field

from dex_celery import (
    Dex,
    EffectClass,
    InvalidToolArguments,
    Settings,
    ToolContext,
    ToolPolicy,
)
from dex_celery.engine.attempt.invoke import encode_result, is_async
from dex_celery.errors import SealError
from dex_celery.ledger.ledger import Cause
from dex_celery.tools.arguments import check_arguments
from dex_celery.tools.sealing import Scrubber, open_arguments, seal, split_secrets
from dex_celery.tools.tool import Tool


class Colour(StrEnum):
    RED = "red"
    BLUE = "blue"


class Address(BaseModel):
    street: str
    number: int


@pytest.fixture
def dex() -> Dex:
    dex = Dex(Celery("t"), Settings(secret_key="unit"))

    @dex.tool(policy=ToolPolicy(effect=EffectClass.READ))
    def lookup(
        ctx: ToolContext,
        order: Annotated[int, Field(description="the order number", ge=1)],
        colour: Colour = Colour.RED,
        mode: Literal["fast", "exact"] = "fast",
        address: Address | None = None,
    ) -> Any:
        """Look an order up."""
        return order

    @dex.tool(policy=ToolPolicy(effect=EffectClass.IDEMPOTENT_WRITE))
    async def refund(ctx: ToolContext, order: int, amount: Decimal, **extra: Any) -> Any:
        """Refund an order."""
        return order

    return dex


def test_the_schema_comes_from_the_signature(dex: Dex) -> None:
    schema = dict(dex.get_tool("lookup").input_schema or {})
    assert schema["required"] == ["order"]
    assert schema["additionalProperties"] is False
    props = schema["properties"]
    assert set(props) == {"order", "colour", "mode", "address"}
    assert props["order"]["description"] == "the order number"
    assert props["order"]["minimum"] == 1
    assert props["mode"]["enum"] == ["fast", "exact"]
    assert "ctx" not in props
    refund = dict(dex.get_tool("refund").input_schema or {})
    assert refund["additionalProperties"] is True


def test_checked_arguments_are_the_tools_types_and_only_those_given(dex: Dex) -> None:
    lookup = dex.get_tool("lookup")
    got = check_arguments(
        lookup, {"order": 3, "colour": "blue", "address": {"street": "Main", "number": 5}}
    )
    assert got["colour"] is Colour.BLUE
    assert got["address"] == Address(street="Main", number=5)
    assert "mode" not in got  # the function's own default applies
    refund = check_arguments(dex.get_tool("refund"), {"order": 1, "amount": "2.5", "note": "x"})
    assert refund == {"order": 1, "amount": Decimal("2.5"), "note": "x"}
    for bad in ({"order": 0}, {"order": 1, "colour": "green"}, {"order": 1, "mode": "slow"}):
        with pytest.raises(InvalidToolArguments):
            check_arguments(lookup, bad)


def test_a_parameter_named_like_a_pydantic_attribute() -> None:
    dex = Dex(Celery("t"), Settings())

    @dex.tool(policy=ToolPolicy(effect=EffectClass.READ))
    def odd(ctx: ToolContext, json: str, model_config: int = 0, schema: str = "") -> Any:
        return json

    got = check_arguments(dex.get_tool("odd"), {"json": "a", "model_config": 2})
    assert got == {"json": "a", "model_config": 2}


def test_tool_definitions_in_three_formats(dex: Dex) -> None:
    schema = dict(dex.get_tool("lookup").input_schema or {})
    openai = {d["function"]["name"]: d for d in dex.tool_definitions(format="openai")}
    assert openai["lookup"] == {
        "type": "function",
        "function": {"name": "lookup", "description": "Look an order up.", "parameters": schema},
    }
    anthropic = {d["name"]: d for d in dex.tool_definitions(format="anthropic")}
    assert anthropic["refund"]["input_schema"]["required"] == ["order", "amount"]
    assert anthropic["lookup"]["description"] == "Look an order up."
    mcp = {d["name"]: d for d in dex.tool_definitions(format="mcp")}
    assert mcp["lookup"]["inputSchema"] == schema
    assert mcp["lookup"]["annotations"]["readOnlyHint"] is True
    assert mcp["refund"]["annotations"] == {
        "readOnlyHint": False,
        "idempotentHint": True,
        "destructiveHint": True,
    }
    json.dumps(dex.tool_definitions(format="mcp"))  # plain JSON values only


def test_sealed_secrets_open_only_with_the_same_key() -> None:
    shown, secrets = split_secrets({"order": 1, "api_token": "tok-123456"}, ("api_token", "absent"))
    assert shown == {"order": 1, "api_token": "***"}
    token = seal(secrets, "key-a")
    assert token is not None and "tok-123456" not in token
    assert open_arguments(shown, token, "key-a") == {"order": 1, "api_token": "tok-123456"}
    with pytest.raises(SealError):
        open_arguments(shown, token, "key-b")
    assert seal({}, None) is None


def test_scrubber_replaces_exact_values_in_texts_and_json() -> None:
    scrub = Scrubber({"a": 'tok"quoted\\value', "b": "ab", "c": 12345678})
    assert scrub.text('x tok"quoted\\value y') == "x *** y"
    assert scrub.text(json.dumps({"k": 'tok"quoted\\value'})) == '{"k": "***"}'
    assert scrub.text("ab is too short to scrub") == "ab is too short to scrub"
    assert scrub.text("id 12345678") == "id ***"
    assert scrub.value({'tok"quoted\\value': ['tok"quoted\\value!']}) == {"***": ["***!"]}


def test_results_are_bounded_and_honest() -> None:
    read = Tool("r", lambda ctx: None, ToolPolicy(effect=EffectClass.READ))
    write = Tool("w", lambda ctx: None, ToolPolicy(effect=EffectClass.NON_IDEMPOTENT_WRITE))
    session_default = Tool("u", lambda ctx: None, ToolPolicy())
    none = Scrubber()
    assert encode_result(read, {"a": 1}, scrubber=none, limit=100) == (Cause.OK, '{"a": 1}')
    cause, text = encode_result(read, "x" * 200, scrubber=none, limit=100)
    assert cause is Cause.TOOL_ERROR and "202 bytes" in text
    for tool in (write, session_default):
        cause, text = encode_result(tool, "x" * 200, scrubber=none, limit=100)
        assert cause is Cause.OK
        assert json.loads(text)["bytes"] == 202
        cause, text = encode_result(tool, float("nan"), scrubber=none, limit=100)
        assert cause is Cause.OK and "not JSON" in json.loads(text)["result_not_kept"]
    assert encode_result(read, object(), scrubber=none, limit=100)[0] is Cause.TOOL_ERROR


def test_async_detection() -> None:
    async def f(ctx: ToolContext) -> None: ...

    class Callable_:
        async def __call__(self, ctx: ToolContext) -> None: ...

    assert is_async(f) and is_async(Callable_()) and not is_async(lambda ctx: None)
    assert asyncio.iscoroutinefunction(f)
