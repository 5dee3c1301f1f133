"""Arguments that used to escape as raw exceptions (deep nesting: `RecursionError`; a lone
surrogate: `UnicodeEncodeError`), and a Hypothesis fuzz of `parse_arguments`, the one parser
every door's arguments pass (S9.3): whatever comes in, the answer is the parsed arguments or a
`DexError` of the arguments kind, never another exception."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given

from dex_celery.engine.request.dispatch import parse_arguments
from dex_celery.errors import ArgumentsTooLarge, InvalidArguments
from dex_celery.model.argument_shape import MAX_ARGUMENT_DEPTH, too_deep
from tests.support.inputs.fuzz import DEEP, arguments, fuzz_settings, nested

LIMIT = 64 * 1024


@pytest.mark.parametrize(
    "given_arguments",
    [
        {"a": nested(DEEP)},
        '{"a":' + "[" * DEEP + "]" * DEEP + "}",
        "[" * 100_000,
        '{"a":' * 100_000,
        {"a": nested(MAX_ARGUMENT_DEPTH)},  # just over: the object itself is a level
    ],
    ids=["deep-object", "deep-json", "deep-open-array", "deep-open-object", "one-too-deep"],
)
def test_deep_nesting_is_invalid_arguments(given_arguments: Any) -> None:
    with pytest.raises(InvalidArguments, match=r"nest deeper|not valid JSON"):
        parse_arguments(given_arguments, limit=LIMIT)


def test_the_deepest_allowed_arguments_pass() -> None:
    value = {"a": nested(MAX_ARGUMENT_DEPTH - 1)}
    assert not too_deep(value)
    assert parse_arguments(value, limit=LIMIT)[0] == value


@pytest.mark.parametrize(
    "given_arguments",
    [{"a": "\udc80"}, {"\ud800": 1}, {"a": ["x\udfffy"]}, '{"a": "\\udc80"}'],
    ids=["value", "name", "nested", "json-escape"],
)
def test_a_lone_surrogate_is_invalid_arguments(given_arguments: Any) -> None:
    with pytest.raises(InvalidArguments, match="lone surrogate"):
        parse_arguments(given_arguments, limit=LIMIT)


@fuzz_settings()
@given(arguments)
def test_any_arguments_parse_or_are_refused_with_a_typed_error(value: Any) -> None:
    try:
        parsed, text = parse_arguments(value, limit=LIMIT)
    except (InvalidArguments, ArgumentsTooLarge):
        return
    assert json.loads(text) == json.loads(json.dumps(parsed, sort_keys=True))
    assert len(text.encode()) <= LIMIT
