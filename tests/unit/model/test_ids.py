"""Call identity and the idempotency key (S2.1, S2.2) and Celery task ids (docs/ledger.md)."""

from __future__ import annotations

import pytest

from dex_celery import CallKey, InvalidId, InvalidRequest
from dex_celery.model.ids import MAX_ID_LENGTH, parse_task_id, validate_id


def test_the_key_is_the_three_ids_joined_by_slashes() -> None:
    """S2.1: `session-42/turn-3/call-7`, the same string for every attempt."""
    key = CallKey.of("session-42", "turn-3", "call-7")
    assert str(key) == key.key == "session-42/turn-3/call-7"
    assert (key.session_id, key.turn_id, key.tool_call_id) == ("session-42", "turn-3", "call-7")
    assert key.task_id(1) == "session-42/turn-3/call-7#1"
    assert key.task_id(12) == "session-42/turn-3/call-7#12"


@pytest.mark.parametrize(
    "value",
    [
        "a",
        "x" * MAX_ID_LENGTH,
        "call_01HZX-ÄÖ.ü:7",
        "with inner space",
        "emoji-\U0001f600",
        "toolu_01A09q90qw90lq917835lq9",
    ],
)
def test_ids_that_keep_the_key_unambiguous_are_accepted(value: str) -> None:
    assert validate_id("turn id", value) == value
    key = CallKey.of(value, value, value)
    assert CallKey.parse(str(key)) == key


@pytest.mark.parametrize(
    ("value", "reason"),
    [
        ("", "must not be empty"),
        ("a/b", "ambiguous"),
        ("/", "ambiguous"),
        ("a#1", "ambiguous"),
        ("{tag}", "ambiguous"),
        ("x" * (MAX_ID_LENGTH + 1), "the limit is 200"),
        ("tab\there", "control characters"),
        ("new\nline", "control characters"),
        ("nul\x00", "control characters"),
        ("esc\x1b[0m", "control characters"),
        ("del\x7f", "control characters"),
        ("c1\x85", "control characters"),
        ("zero\u200bwidth", "control characters"),
        ("bidi\u202e", "control characters"),
        (" padded", "leading or trailing spaces"),
        ("padded ", "leading or trailing spaces"),
    ],
)
def test_ambiguous_ids_are_refused_with_a_reason(value: str, reason: str) -> None:
    """S2.2: empty, '/', control characters, over 200 characters: a clear, typed error."""
    with pytest.raises(InvalidId, match=reason):
        validate_id("tool-call id", value)


@pytest.mark.parametrize("value", [None, 7, 7.0, b"bytes", ["a"], ("a",), {"a": 1}])
def test_non_strings_are_refused(value: object) -> None:
    """S2.2, S9.3: ids are text; anything else is an InvalidId naming the type."""
    with pytest.raises(InvalidId, match="must be a string"):
        validate_id("session id", value)


@pytest.mark.parametrize("position", [0, 1, 2])
def test_each_part_is_checked_and_named(position: int) -> None:
    """S2.2: the error says which id is wrong."""
    parts: list[object] = ["s", "t", "c"]
    parts[position] = "bad/id"
    name = ("session id", "turn id", "tool-call id")[position]
    with pytest.raises(InvalidId, match=f"^{name} "):
        CallKey.of(*parts)


def test_invalid_id_is_a_request_error_and_a_value_error() -> None:
    """errors.py: callers catching ValueError or InvalidRequest both see it."""
    assert issubclass(InvalidId, InvalidRequest)
    assert issubclass(InvalidId, ValueError)


@pytest.mark.parametrize(
    "text", ["s/t", "s/t/c/d", "s", "", "s//c", "/t/c", "s/t/", 42, None, "s/t/c#1"]
)
def test_parse_refuses_anything_but_three_valid_parts(text: object) -> None:
    with pytest.raises(InvalidId):
        CallKey.parse(text)


def test_parse_and_task_ids_round_trip() -> None:
    key = CallKey.of("session-42", "turn-3", "call-7")
    assert CallKey.parse("session-42/turn-3/call-7") == key
    assert parse_task_id(key.task_id(3)) == (key, 3)
    assert parse_task_id("a/b/c#1") == (CallKey("a", "b", "c"), 1)


@pytest.mark.parametrize(
    "task_id",
    [
        "a/b/c",
        "a/b/c#",
        "a/b/c#0",
        "a/b/c#-1",
        "a/b/c#x",
        "a/b/c#1.5",
        "a/b#1",
        "#1",
        "celery-uuid-4f1c",
        "a/b/c#1#2",
    ],
)
def test_task_ids_that_are_not_ours_are_refused(task_id: str) -> None:
    """The fast path ignores task ids it cannot parse instead of acting on a wrong call."""
    with pytest.raises(InvalidId):
        parse_task_id(task_id)


def test_keys_order_and_compare_by_value() -> None:
    a, b = CallKey.of("s", "t", "a"), CallKey.of("s", "t", "b")
    assert a < b
    assert a == CallKey.parse("s/t/a")
    assert len({a, CallKey.parse("s/t/a")}) == 1
