"""Hypothesis strategies of hostile input for the fuzz tests of every entry point (S9.3): deep
nesting, lone surrogates, NUL, integers beyond 64 bits, NaN and infinities, odd Python types,
unicode everywhere an id goes, very long strings. The budget is the `fuzz` profile registered
in tests/conftest.py (`fuzz_settings`)."""

from __future__ import annotations

import datetime
import decimal
import os
from typing import Any

from hypothesis import settings
from hypothesis import strategies as st

#: Deep enough to pass Python's recursion limit in any encoder or decoder.
DEEP = 5_000


def fuzz_settings() -> settings:
    """The fuzz profile (or `DEX_HYPOTHESIS_PROFILE`, e.g. `fuzz-long` for a longer search)."""
    return settings.get_profile(os.environ.get("DEX_HYPOTHESIS_PROFILE", "fuzz"))


class Deep(dict[str, Any]):
    """The outermost object of a deeply nested value: its repr is short, so a report of a
    failing example (Hypothesis prints it) does not recurse as deep as the value."""

    depth: int = 0

    def __repr__(self) -> str:
        return f"nested({self.depth})"

    def _repr_pretty_(self, printer: Any, cycle: bool) -> None:
        printer.text(repr(self))


def nested(depth: int, leaf: Any = 1) -> Any:
    """`depth` levels of alternating lists and objects around `leaf`, built without recursion."""
    value = leaf
    for level in range(depth - 1):
        value = [value] if level % 2 else {"k": value}
    deep = Deep(k=value)
    deep.depth = depth
    return deep


#: Text that breaks encoders: lone surrogates, NUL, controls, bidi marks, very long runs.
hostile_text = st.one_of(
    st.text(max_size=40),
    st.text(st.characters(min_codepoint=0xD800, max_codepoint=0xDFFF), min_size=1, max_size=3),
    st.sampled_from(["\x00", "a\x00b", "\u202e", "\ufeff", "\U0010ffff", "\r\n", "\t", " x "]),
    st.integers(min_value=10_000, max_value=300_000).map(lambda n: "x" * n),
    st.builds(lambda a, b: a + "\udc80" + b, st.text(max_size=5), st.text(max_size=5)),
)

#: Numbers a JSON encoder or a 64-bit column may choke on.
hostile_numbers = st.one_of(
    st.integers(min_value=2**63 - 2, max_value=2**63 + 2),
    st.integers(min_value=-(2**200), max_value=2**200),
    st.sampled_from([float("nan"), float("inf"), float("-inf"), -0.0, 1e308, 5e-324]),
    st.none().map(lambda _: 10**5000),  # built late: its repr itself raises
)

#: Values that are not JSON at all.
odd_values = st.one_of(
    st.sampled_from(
        [
            b"bytes",
            bytearray(b"x"),
            {1, 2},
            frozenset(),
            (1, 2),
            object(),
            datetime.datetime(2026, 1, 1),
            decimal.Decimal("1.5"),
            decimal.Decimal("NaN"),
            complex(1, 2),
            Ellipsis,
            type,
        ]
    ),
    st.builds(lambda d: nested(d), st.integers(min_value=DEEP, max_value=DEEP * 4)),
)

#: A leaf of an argument value.
leaves = st.one_of(st.none(), st.booleans(), hostile_numbers, hostile_text, odd_values)

#: Argument values: leaves in lists and objects (keys hostile too, some not strings).
values = st.recursive(
    leaves,
    lambda inner: st.one_of(
        st.lists(inner, max_size=3),
        st.dictionaries(st.one_of(hostile_text, st.integers(), st.none()), inner, max_size=3),
    ),
    max_leaves=8,
)

#: Whole `arguments` as a caller might send them: mostly objects, sometimes not.
arguments = st.one_of(
    st.dictionaries(hostile_text, values, max_size=4),
    values,
    st.builds(lambda d: nested(d), st.integers(min_value=DEEP, max_value=DEEP * 4)),
)

#: Ids as a caller might send them: unicode, separators, controls, surrogates, long, not text.
ids = st.one_of(
    hostile_text,
    st.sampled_from(["", "a/b", "a#1", "{x}", " a", "a ", "é", "😀", "a\x00", "\ud800"]),
    st.integers(),
    st.none(),
    st.just("x" * 201),
)

#: Ids that are valid, unicode included (accents, emoji, scripts other than Latin).
valid_ids = st.text(
    st.characters(blacklist_categories=("C", "Z"), blacklist_characters="/#{}"),
    min_size=1,
    max_size=30,
)

#: Arguments a tool accepts (names and values of the plain kind).
plain_arguments = st.dictionaries(
    st.text(st.characters(categories=("L",)), min_size=1, max_size=8),
    st.one_of(st.integers(-1000, 1000), st.text(max_size=20), st.booleans(), st.none()),
    max_size=3,
)

#: Which part of a request is the hostile one (the others valid, so each reaches deep).
HOSTILE_PART = ("session", "turn", "call", "tool", "arguments", "all", "none", "none", "none")


@st.composite
def requests(draw: st.DrawFn, tools: tuple[str, ...]) -> dict[str, Any]:
    """One `request_call`'s parts: valid but for one hostile part (sometimes all, sometimes
    none), so the fuzz reaches every check, the last ones too."""
    hostile = draw(st.sampled_from(HOSTILE_PART))

    def part(name: str, valid: st.SearchStrategy[Any], bad: st.SearchStrategy[Any]) -> Any:
        return draw(bad if hostile in (name, "all") else valid)

    return {
        "session": part("session", valid_ids, ids),
        "turn": part("turn", valid_ids, ids),
        "call": part("call", st.uuids().map(lambda u: u.hex), ids),
        "tool": part(
            "tool", st.sampled_from(tools), st.one_of(hostile_text, st.none(), st.integers())
        ),
        "arguments": part("arguments", plain_arguments, arguments),
    }


#: JSON values that can travel in a JSON-RPC request (no Python-only types).
_wire_leaves = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**200), max_value=2**200),
    st.sampled_from([float("nan"), float("inf"), -0.0, 1e308]),
    hostile_text,
)
wire_values = st.recursive(
    _wire_leaves,
    lambda inner: st.one_of(
        st.lists(inner, max_size=3), st.dictionaries(hostile_text, inner, max_size=3)
    ),
    max_leaves=8,
)


def _json_text(value: Any) -> str:
    # `ensure_ascii`: a lone surrogate travels as its `\\udXXX` escape, as any client sends it;
    # NaN and Infinity as Python's JSON writes them (not JSON: the server must refuse them).
    import json  # here: only the wire texts need it

    return json.dumps(value, ensure_ascii=True)


#: JSON texts of argument values as a client could send them, deep nesting and numbers too
#: long for any parser included (built as text: no encoder could write them).
json_texts = st.one_of(
    wire_values.map(_json_text),
    st.sampled_from([10, 63, 64, 65, 200, 5_000]).map(lambda d: "[" * d + "]" * d),
    st.sampled_from(["1" * 5_000, "1e400", "-0", "18446744073709551616", '"\\u0000"']),
)
