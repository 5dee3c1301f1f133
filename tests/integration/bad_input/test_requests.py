"""Bad input gets a typed error and leaves nothing behind (S9.3, S2.2, S2.3; issue 2, test 8).

Every request goes through the public client against the real redis-server fixture and a real
SQLite file. "Nothing behind" is checked everywhere a request could write: the SQL tables
(calls, sessions, messages), the ledger and events keys under the test's prefix, the Celery
broker queue, and the Redis database as a whole.
"""

from __future__ import annotations

import datetime
import json
import math
from collections.abc import Iterator
from decimal import Decimal
from typing import Any, cast

import pytest
import redis

from devtools.toolapp import make_app
from dex_celery import (
    ArgumentsTooLarge,
    CallRequest,
    CallStatus,
    Dex,
    InvalidArguments,
    InvalidId,
    InvalidRequest,
    InvalidText,
    Settings,
    ToolPolicy,
    UnknownEffectClass,
    UnknownSession,
    UnknownTool,
)
from dex_celery.model.ids import MAX_ID_LENGTH
from tests.support.inputs.bad_input import BROKER_QUEUE, assert_nothing_written, sql_rows

pytestmark = pytest.mark.filterwarnings("ignore::celery.exceptions.DuplicateTaskNameWarning")


@pytest.fixture
def broker(env: dict[str, str]) -> Iterator[redis.Redis]:
    client = redis.Redis.from_url(env["DEX_REDIS_URL"], decode_responses=True)
    yield client
    client.close()


# --- unknown tool ------------------------------------------------------------------------------


def test_unknown_tool(dex: Dex, broker: redis.Redis) -> None:
    """S9.3: an unknown tool is a typed LookupError naming the known tools; nothing recorded."""
    with pytest.raises(UnknownTool, match=r"no tool named 'teleport'.*known: .*echo"):
        dex.client().request_call("s1", "t1", "c1", "teleport", {})
    assert_nothing_written(dex, broker)


# --- arguments ---------------------------------------------------------------------------------


@pytest.mark.parametrize("text", ["{not json", "", "{'single': 'quotes'}", '{"a": 1', "\x00"])
def test_arguments_that_are_not_json_text(dex: Dex, broker: redis.Redis, text: str) -> None:
    """S9.3: arguments that are not JSON."""
    with pytest.raises(InvalidArguments, match="not valid JSON"):
        dex.client().request_call("s1", "t1", "c1", "echo", text)
    assert_nothing_written(dex, broker)


@pytest.mark.parametrize("text", ["[1, 2]", "3", '"a string"', "null", "true"])
def test_json_that_is_not_an_object(dex: Dex, broker: redis.Redis, text: str) -> None:
    """S9.3: a tool gets keyword arguments, so only a JSON object will do."""
    with pytest.raises(InvalidArguments, match="must be a JSON object"):
        dex.client().request_call("s1", "t1", "c1", "echo", text)
    assert_nothing_written(dex, broker)


@pytest.mark.parametrize("value", [[1, 2], 3, None, "x", (("a", 1),)])
def test_python_values_that_are_not_a_mapping(dex: Dex, broker: redis.Redis, value: Any) -> None:
    with pytest.raises(InvalidArguments):
        dex.client().request_call("s1", "t1", "c1", "echo", value)
    assert_nothing_written(dex, broker)


@pytest.mark.parametrize(
    "arguments",
    [
        {"when": datetime.datetime(2024, 1, 1)},
        {"tags": {"a", "b"}},
        {"amount": Decimal("1.50")},
        {"blob": b"\x00\x01"},
        {"nested": {"deep": [object()]}},
        {1: "a", "b": 2},
        {1: "a"},
        {("tuple", "key"): 1},
    ],
)
def test_arguments_that_cannot_be_json(
    dex: Dex, broker: redis.Redis, arguments: dict[Any, Any]
) -> None:
    """S9.2, S9.3: messages are JSON only; a value or name JSON cannot carry is refused."""
    with pytest.raises(InvalidArguments):
        dex.client().request_call("s1", "t1", "c1", "echo", arguments)
    assert_nothing_written(dex, broker)


@pytest.mark.parametrize(
    "arguments",
    [
        {"x": math.nan},
        {"x": math.inf},
        {"x": [1, -math.inf]},
        '{"x": NaN}',
        '{"x": Infinity}',
        '{"x": -Infinity}',
    ],
)
def test_nan_and_infinity_are_refused(
    dex: Dex, broker: redis.Redis, arguments: dict[str, Any] | str
) -> None:
    """S9.3: NaN and Infinity are not JSON, even though Python's json reads and writes them."""
    with pytest.raises(InvalidArguments, match="cannot be encoded as JSON"):
        dex.client().request_call("s1", "t1", "c1", "echo", arguments)
    assert_nothing_written(dex, broker)


@pytest.fixture
def small_dex(env: dict[str, str], monkeypatch: pytest.MonkeyPatch) -> Dex:
    """A Dex whose argument limit is 64 bytes."""
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    _app, dex = make_app(Settings.from_env(env, max_argument_bytes=64))
    dex.store.create_schema()
    return dex


def _arguments_of_size(size: int, char: str = "x") -> dict[str, str]:
    """`{"v":"xxx..."}` encoded canonically is exactly `size` bytes."""
    overhead = len(b'{"v":""}')
    width = len(char.encode())
    assert (size - overhead) % width == 0
    return {"v": char * ((size - overhead) // width)}


def test_arguments_over_the_size_limit(small_dex: Dex, broker: redis.Redis) -> None:
    """S9.3: oversized payloads are refused with the size and the limit, in UTF-8 bytes."""
    client = small_dex.client()
    with pytest.raises(ArgumentsTooLarge, match="65 bytes; the limit is 64 bytes"):
        client.request_call("s1", "t1", "c1", "echo", _arguments_of_size(65))
    with pytest.raises(ArgumentsTooLarge, match="66 bytes"):
        client.request_call("s1", "t1", "c1", "echo", _arguments_of_size(66, "é"))
    with pytest.raises(ArgumentsTooLarge):
        client.request_call("s1", "t1", "c1", "echo", json.dumps(_arguments_of_size(200)))
    assert issubclass(ArgumentsTooLarge, InvalidArguments)
    assert_nothing_written(small_dex, broker)


def test_arguments_exactly_at_the_size_limit_are_accepted(
    small_dex: Dex, broker: redis.Redis
) -> None:
    """S9.3: the limit is inclusive; the record stores the canonical JSON that was measured."""
    record = small_dex.client().request_call("s1", "t1", "c1", "echo", _arguments_of_size(64, "é"))
    assert len(record.arguments.encode()) == 64
    assert record.status is CallStatus.PENDING
    assert broker.llen(BROKER_QUEUE) == 1


# --- ids -------------------------------------------------------------------------------------

BAD_IDS: list[object] = [
    "",
    "a/b",
    "a#1",
    "{x}",
    "line\nbreak",
    "tab\t",
    "nul\x00",
    "x" * (MAX_ID_LENGTH + 1),
    " lead",
    None,
    42,
]


@pytest.mark.parametrize("position", [0, 1, 2], ids=["session", "turn", "call"])
@pytest.mark.parametrize("bad", BAD_IDS, ids=lambda v: repr(v)[:12])
def test_each_malformed_id(dex: Dex, broker: redis.Redis, position: int, bad: object) -> None:
    """S2.2: ids that would make the key ambiguous are refused when the call is requested."""
    ids: list[Any] = ["s1", "t1", "c1"]
    ids[position] = bad
    with pytest.raises(InvalidId):
        dex.client().request_call(ids[0], ids[1], ids[2], "echo", {})
    assert_nothing_written(dex, broker)


def test_malformed_session_id_when_opening_a_session(dex: Dex, broker: redis.Redis) -> None:
    with pytest.raises(InvalidId):
        dex.client().open_session("a/b")
    assert_nothing_written(dex, broker)


# --- effect classes ----------------------------------------------------------------------------


def test_unknown_effect_class_in_a_tool_policy(dex: Dex, broker: redis.Redis) -> None:
    """S1.2, S9.3: a policy naming an unknown class never registers, so never records."""
    with pytest.raises(UnknownEffectClass, match="'writes'"):
        ToolPolicy(effect="writes")  # type: ignore[arg-type]
    assert "writes_tool" not in dex.tools
    assert_nothing_written(dex, broker)


def test_unknown_effect_class_as_a_session_default(dex: Dex, broker: redis.Redis) -> None:
    """S1.4, S9.3: the session default goes through the same strict parser; no session row."""
    with pytest.raises(UnknownEffectClass):
        dex.client().open_session("s1", default_effect="Read")
    assert_nothing_written(dex, broker)


# --- batches -----------------------------------------------------------------------------------

GOOD = [
    CallRequest("s1", "t1", "c1", "echo", {"q": 1}),
    CallRequest("s1", "t1", "c2", "slow_read", {"seconds": 0}),
]


@pytest.mark.parametrize(
    ("bad", "error"),
    [
        (CallRequest("s1", "t1", "c/3", "echo", {}), InvalidId),
        (CallRequest("s1", "t1", "c3", "nope", {}), UnknownTool),
        (CallRequest("s1", "t1", "c3", "echo", "[1]"), InvalidArguments),
        (CallRequest("s1", "t1", "c3", "echo", {"x": math.nan}), InvalidArguments),
    ],
    ids=["bad-id", "unknown-tool", "not-an-object", "nan"],
)
@pytest.mark.parametrize("where", ["first", "last"])
def test_a_batch_with_one_bad_request_records_none(
    dex: Dex, broker: redis.Redis, bad: CallRequest, error: type[Exception], where: str
) -> None:
    """S9.3: calls of one turn are validated together; one bad request refuses them all."""
    batch = [bad, *GOOD] if where == "first" else [*GOOD, bad]
    with pytest.raises(error):
        dex.client().request_calls(batch)
    assert_nothing_written(dex, broker)


def test_every_bad_request_error_is_typed() -> None:
    """S9.3: callers can catch the family, or the standard ValueError / LookupError."""
    for e in (InvalidId, InvalidArguments, ArgumentsTooLarge, InvalidText):
        assert issubclass(e, InvalidRequest) and issubclass(e, ValueError)
    assert issubclass(UnknownTool, LookupError)
    assert issubclass(UnknownEffectClass, ValueError)


# --- user messages -----------------------------------------------------------------------------


@pytest.mark.parametrize("text", ["", "   \n", None, 42, "x" * (64 * 1024 + 1)])
def test_bad_user_message_text(dex: Dex, broker: redis.Redis, text: Any) -> None:
    """S7.4, S9.3: an empty, non-text or oversized message is refused; nothing appended."""
    dex.store.open_session("s1")
    with pytest.raises(InvalidText):
        dex.client().send_user_message("s1", text)
    rows = sql_rows(dex)
    assert (rows["dex_messages"], rows["dex_tool_calls"]) == (0, 0)
    assert broker.dbsize() == 0


def test_user_message_to_an_unknown_session(dex: Dex, broker: redis.Redis) -> None:
    """S7.4, S9.3: no session is created by a message sent to the wrong id."""
    with pytest.raises(UnknownSession):
        dex.client().send_user_message("nobody", "hello")
    assert_nothing_written(dex, broker)


# --- S2.3 --------------------------------------------------------------------------------------


def test_the_same_ids_twice_are_one_call_and_one_message(dex: Dex, broker: redis.Redis) -> None:
    """S2.3: the second request (same tool, same arguments, keys in another order) returns the
    existing record and enqueues nothing. Other arguments are a conflict: test_call_edges.py."""
    client = dex.client()
    first = client.request_call("s1", "t1", "c1", "echo", {"q": 1, "r": 2})
    second = client.request_call("s1", "t1", "c1", "echo", '{"r": 2, "q": 1}')
    assert second == first
    assert json.loads(second.arguments) == {"q": 1, "r": 2}
    assert sql_rows(dex)["dex_tool_calls"] == 1
    assert broker.llen(BROKER_QUEUE) == 1
    requested = [
        f for _id, f in cast(list[tuple[str, dict[str, str]]], broker.xrange(dex.keys.events))
    ]
    assert [f["type"] for f in requested] == ["tool_call_requested"]


def test_the_same_ids_twice_in_one_batch_are_one_call(dex: Dex, broker: redis.Redis) -> None:
    """S2.3: within one turn's batch too."""
    records = dex.client().request_calls(
        [
            CallRequest("s1", "t1", "c1", "echo", {"q": 1}),
            CallRequest("s1", "t1", "c1", "echo", {"q": 1}),
        ]
    )
    assert [r.key for r in records] == ["s1/t1/c1"]
    assert sql_rows(dex)["dex_tool_calls"] == 1
    assert broker.llen(BROKER_QUEUE) == 1


def test_a_duplicate_after_the_call_ended_returns_the_outcome(
    dex: Dex, broker: redis.Redis
) -> None:
    """S2.3: asking again for a call that already ended does not run it again."""
    client = dex.client()
    first = client.request_call("s1", "t1", "c1", "echo", {})
    broker.delete(BROKER_QUEUE)
    from dex_celery.store.values import Outcome

    assert dex.store.record_outcome(first.key, Outcome(CallStatus.SUCCEEDED, "", result="1"))
    again = client.request_call("s1", "t1", "c1", "echo", {})
    assert (again.status, again.result) == (CallStatus.SUCCEEDED, "1")
    assert broker.llen(BROKER_QUEUE) == 0
