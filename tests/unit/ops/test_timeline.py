"""The timeline's assembly, without a database (S13.6): one time order whatever source an entry
comes from, the same instant written at two precisions kept in causal order, a new source
joining by being listed, the page's address of a session with any valid id, and the one setting
that names the web app's address on a call's spans."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import replace

import pytest

from dex_celery.errors import ConfigurationError
from dex_celery.model.freeze import ALL_TOOLS, FreezeMode, WriteFreeze
from dex_celery.model.links import session_path, session_url
from dex_celery.model.policy import EffectClass
from dex_celery.model.records import SessionRecord
from dex_celery.ops.timeline import (
    SOURCES,
    Entry,
    EntryKind,
    SessionFacts,
    _same_instant,
    assemble,
)
from dex_celery.settings import Settings
from dex_celery.store.freezes import FreezeHold

FACTS = SessionFacts(
    session=SessionRecord("s", EffectClass.READ, 100.0),
    calls=(),
    messages=(),
    ledger={},
    unknowns=(),
    checked_tools=frozenset(),
    full=False,
)


def test_entries_of_every_source_are_in_one_time_order_and_ties_in_causal_order() -> None:
    def late(facts: SessionFacts) -> Iterator[Entry]:
        yield Entry(103.0, EntryKind.CALL_ENDED, "ended", call_key="s/t/c")
        yield Entry(103.0, EntryKind.ATTEMPT_ENDED, "attempt ended", call_key="s/t/c")
        yield Entry(101.0, EntryKind.CALL_REQUESTED, "requested", call_key="s/t/c")

    def early(facts: SessionFacts) -> Iterator[Entry]:
        yield Entry(100.5, EntryKind.USER, "asked")

    entries = assemble(FACTS, (*SOURCES, late, early))
    assert [e.kind for e in entries] == [
        EntryKind.SESSION_OPENED,
        EntryKind.USER,
        EntryKind.CALL_REQUESTED,
        EntryKind.ATTEMPT_ENDED,
        EntryKind.CALL_ENDED,
    ]
    assert entries[0].text == "default effect class: read"
    assert entries[2].call_name == "t/c" and entries[0].call_name is None
    assert entries[1].as_dict()["time"] == "1970-01-01 00:01:40.500 UTC"


def test_an_attempt_end_logged_at_lower_precision_is_the_call_end() -> None:
    """The ledger's log has 14 digits, the call's end 17: 0.05 ms apart is one instant."""
    finished = 1796472300.1234567
    assert _same_instant(finished + 0.00005, finished) == finished
    assert _same_instant(finished + 0.01, finished) == finished + 0.01
    assert _same_instant(finished - 1.0, finished) == finished - 1.0
    assert _same_instant(finished + 0.00005, None) == finished + 0.00005


def test_a_session_page_names_any_valid_session_id_exactly() -> None:
    assert session_path("s1") == "/sessions/s1"
    assert session_path("Köln · 1002?x=1 %") == "/sessions/K%C3%B6ln%20%C2%B7%201002%3Fx%3D1%20%25"
    assert session_url(None, "s1") is None
    assert session_url("https://dex.example.com/ops/", "a b") == (
        "https://dex.example.com/ops/sessions/a%20b"
    )


@pytest.mark.parametrize(
    "url",
    ["dex.example.com", "ftp://dex.example.com", "https://x/?q=1", "https://x/#f", "https://"],
)
def test_the_web_base_url_must_be_an_http_address(url: str) -> None:
    with pytest.raises(ConfigurationError, match="web_base_url"):
        Settings(web_base_url=url)
    assert Settings(web_base_url="https://dex.example.com:8443/ops").web_base_url


def test_a_write_freeze_joins_the_timeline_as_one_more_source() -> None:
    """S13.6.5 with S13.2: a call held at its claim, then released by a thaw."""
    freeze = WriteFreeze(1, ALL_TOOLS, FreezeMode.HOLD, "incident 42", "ann", 102.0, "bob", 104.0)
    facts = replace(FACTS, holds=(FreezeHold("s/t/c", freeze, 103.0, 104.5),))
    held, released = assemble(facts)[1:]
    assert (held.kind, held.at, held.actor, held.text) == (
        EntryKind.HELD_BY_FREEZE,
        103.0,
        "ann",
        "incident 42",
    )
    assert "write freeze of every tool" in held.summary and held.call_name == "t/c"
    assert (released.kind, released.at, released.actor) == (
        EntryKind.RELEASED_BY_THAW,
        104.5,
        "bob",
    )
