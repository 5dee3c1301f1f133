"""The bad-input suite, grown by issue 11: arguments that do not fit the tool, ids reused for
another call, secrets that cannot be sealed, tools that cannot be registered (S9.3, S2.3).

Each case gets its typed error and leaves nothing half-written: zero SQL rows, zero ledger keys,
an empty broker queue, no events (`assert_nothing_written`). A conflicting request after a first
one leaves everything exactly as the first left it.
"""

from __future__ import annotations

from decimal import Decimal
from typing import Any

import pytest
import redis
from celery import Celery

from devtools.toolapp import make_app
from dex_celery import (
    CallConflict,
    CallRequest,
    Dex,
    EffectClass,
    InvalidArguments,
    InvalidToolArguments,
    InvalidToolSignature,
    SecretKeyMissing,
    Settings,
    ToolContext,
    ToolPolicy,
)
from dex_celery.errors import UnknownDefinitionFormat
from dex_celery.tools.arguments import check_arguments
from dex_celery.tools.tool import Tool
from tests.support.inputs.bad_input import BROKER_QUEUE, assert_nothing_written, sql_rows

pytestmark = pytest.mark.filterwarnings("ignore::celery.exceptions.DuplicateTaskNameWarning")


@pytest.fixture
def broker(env: dict[str, str]) -> redis.Redis:
    return redis.Redis.from_url(env["DEX_REDIS_URL"], decode_responses=True)


# --- arguments that do not fit the tool (checked at request time) -------------------------------


@pytest.mark.parametrize(
    ("tool", "arguments", "message"),
    [
        ("typed", {"order": 1, "amount": "1.5"}, "missing required argument 'note'"),
        ("typed", {"order": 1, "amount": 1, "note": {}, "extra": 2}, "unexpected argument 'extra'"),
        ("typed", {"order": "seven", "amount": 1, "note": {}}, "argument 'order'"),
        ("typed", {"order": 1, "amount": "lots", "note": {}}, "argument 'amount'"),
        ("typed", {"order": 1, "amount": 1, "note": [1]}, "argument 'note'"),
        ("async_echo", {}, "missing required argument 'text'"),
        ("slow_read", {"seconds": "soon"}, "argument 'seconds'"),
        ("leaky", {"order": 1, "api_token": "tok-123456", "amount": 5}, "unexpected argument"),
    ],
)
def test_arguments_that_do_not_fit_the_signature(
    dex: Dex, broker: redis.Redis, tool: str, arguments: dict[str, Any], message: str
) -> None:
    """Missing, extra or mistyped arguments are refused before anything is recorded, so no person
    is asked to approve a call that cannot run, and the model reads why."""
    with pytest.raises(InvalidToolArguments, match=message) as raised:
        dex.client().request_call("s1", "t1", "c1", tool, arguments)
    assert isinstance(raised.value, InvalidArguments)
    assert "tok-123456" not in str(raised.value)
    assert_nothing_written(dex, broker)


def test_a_guarded_write_with_bad_arguments_never_waits_for_approval(
    dex: Dex, broker: redis.Redis
) -> None:
    """The approval queue never shows a call that would fail with a TypeError once approved."""
    with pytest.raises(InvalidToolArguments, match="unexpected argument 'amount'"):
        dex.client().request_call("s1", "t1", "c1", "guarded_write", {"amount": 5})
    assert dex.client().pending_approvals() == []
    assert_nothing_written(dex, broker)


def test_one_bad_call_in_a_batch_records_none(dex: Dex, broker: redis.Redis) -> None:
    with pytest.raises(InvalidToolArguments):
        dex.client().request_calls(
            [
                CallRequest("s1", "t1", "c1", "echo", {"q": 1}),
                CallRequest("s1", "t1", "c2", "typed", {"order": 1}),
            ]
        )
    assert_nothing_written(dex, broker)


def test_a_schema_only_tool_is_checked_against_its_schema(dex: Dex, broker: redis.Redis) -> None:
    """A tool with a JSON Schema and no Python signature (an MCP server's tool) goes through the
    same entry point, validated with jsonschema; the error does not echo the value given."""

    def call(ctx: ToolContext, **arguments: Any) -> Any:
        return arguments

    schema = {
        "type": "object",
        "properties": {"city": {"type": "string"}, "days": {"type": "integer", "maximum": 7}},
        "required": ["city"],
        "additionalProperties": False,
    }
    dex.add_tool(Tool("forecast", call, ToolPolicy(effect=EffectClass.READ), input_schema=schema))
    client = dex.client()
    for bad in ({"days": 2}, {"city": "Oslo", "days": 99}, {"city": 5}, {"city": "x", "y": 1}):
        with pytest.raises(InvalidToolArguments, match="tool 'forecast'"):
            client.request_call("s1", "t1", "c1", "forecast", bad)
    assert_nothing_written(dex, broker)
    definitions = dex.tool_definitions(format="anthropic")
    assert next(d for d in definitions if d["name"] == "forecast")["input_schema"] == schema


# --- same ids, another call (S2.3) ---------------------------------------------------------------


@pytest.mark.parametrize(
    ("tool", "arguments"),
    [("failing", {"message": "x"}), ("echo", {"q": 2}), ("echo", {"q": 1, "r": 1}), ("echo", {})],
)
def test_same_ids_for_another_tool_or_other_arguments_is_a_conflict(
    dex: Dex, broker: redis.Redis, tool: str, arguments: dict[str, Any]
) -> None:
    """The earlier call is not silently returned as if it answered this one; nothing changes."""
    client = dex.client()
    first = client.request_call("s1", "t1", "c1", "echo", {"q": 1})
    before = (sql_rows(dex), broker.llen(BROKER_QUEUE), broker.xlen(dex.keys.events))
    with pytest.raises(CallConflict, match="s1/t1/c1"):
        client.request_call("s1", "t1", "c1", tool, arguments)
    assert (sql_rows(dex), broker.llen(BROKER_QUEUE), broker.xlen(dex.keys.events)) == before
    assert client.get_call(first.key) == first


def test_a_conflict_in_a_batch_rolls_the_whole_batch_back(dex: Dex, broker: redis.Redis) -> None:
    client = dex.client()
    client.request_call("s1", "t1", "c1", "echo", {"q": 1})
    before = (sql_rows(dex), broker.llen(BROKER_QUEUE))
    with pytest.raises(CallConflict):
        client.request_calls(
            [
                CallRequest("s1", "t1", "c2", "echo", {"q": 2}),
                CallRequest("s1", "t1", "c1", "echo", {"q": 9}),
            ]
        )
    assert (sql_rows(dex), broker.llen(BROKER_QUEUE)) == before
    assert dex.store.get_call("s1/t1/c2") is None


def test_same_ids_twice_in_one_batch_with_other_arguments(dex: Dex, broker: redis.Redis) -> None:
    with pytest.raises(CallConflict):
        dex.client().request_calls(
            [
                CallRequest("s1", "t1", "c1", "echo", {"q": 1}),
                CallRequest("s1", "t1", "c1", "echo", {"q": 2}),
            ]
        )
    assert_nothing_written(dex, broker)


# --- secrets -------------------------------------------------------------------------------------


def test_secret_arguments_must_name_real_parameters() -> None:
    """`secret_arguments=("api_tokn",)` for a parameter named `api_token` is a registration
    error naming the real parameters, not a silent leak."""
    dex = Dex(Celery("t"), Settings(secret_key="k"))

    with pytest.raises(InvalidToolSignature, match=r"'api_tokn'.*parameters: api_token, order"):

        @dex.tool(policy=ToolPolicy(effect=EffectClass.READ, secret_arguments=("api_tokn",)))
        def charge(ctx: ToolContext, order: int, api_token: str) -> Any:
            return order

    assert "charge" not in dex.tools


def test_secret_arguments_without_a_secret_key_are_refused(
    env: dict[str, str], broker: redis.Redis
) -> None:
    """No key to seal with: the call is refused rather than stored in clear."""
    _app, dex = make_app(Settings.from_env({**env, "DEX_SECRET_KEY": ""}))
    dex.store.create_schema()
    with pytest.raises(SecretKeyMissing, match="DEX_SECRET_KEY"):
        dex.client().request_call("s1", "t1", "c1", "with_secret", {"api_token": "tok-1234"})
    assert_nothing_written(dex, broker)


# --- tools that cannot be registered --------------------------------------------------------------


def _positional_only(ctx: ToolContext, a: int, /) -> int:
    return a


def _var_positional(ctx: ToolContext, *a: int) -> int:
    return 0


def _no_context() -> int:
    return 0


def _unschemable(ctx: ToolContext, conn: redis.Redis) -> int:
    return 0


@pytest.mark.parametrize(
    ("fn", "message"),
    [
        (_positional_only, "positional-only"),
        (_var_positional, "positional-only"),
        (_no_context, "ToolContext as its first"),
        (_unschemable, "no JSON Schema"),
    ],
)
def test_signatures_that_cannot_take_json_arguments(fn: Any, message: str) -> None:
    dex = Dex(Celery("t"), Settings())
    with pytest.raises(InvalidToolSignature, match=message):
        dex.tool(policy=ToolPolicy(effect=EffectClass.READ))(fn)
    assert dex.tools == {}


def test_an_input_schema_that_is_not_a_schema() -> None:
    dex = Dex(Celery("t"), Settings())
    with pytest.raises(InvalidToolSignature, match="not a JSON Schema"):
        dex.add_tool(
            Tool("x", _no_context, ToolPolicy(), input_schema={"type": "object", "required": 5})
        )


def test_unknown_tool_definition_format(dex: Dex) -> None:
    with pytest.raises(UnknownDefinitionFormat, match="openai, anthropic, mcp"):
        dex.tool_definitions(format="gemini")


def test_a_decimal_parameter_gets_a_decimal(dex: Dex) -> None:
    """What is validated is what the tool gets: the worker runs the same check on the stored
    arguments (unit-level here; through a worker in test_tools_as_written.py)."""
    got = check_arguments(dex.get_tool("typed"), {"order": 7, "amount": "1.5", "note": {}})
    assert got == {"order": 7, "amount": Decimal("1.5"), "note": {}}
