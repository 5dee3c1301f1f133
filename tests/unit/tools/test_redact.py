"""The one display rule (dex_celery/tools/redact.py): the policy's secret names and `secret`,
hidden at any depth, from stored JSON text or an object; the kwargs Flower shows agree."""

from __future__ import annotations

import json

from dex_celery.tools.redact import redacted_kwargs_repr, shown_arguments

STORED = json.dumps(
    {
        "order": 7,
        "card": "***",
        "note": {"secret": "hunter2-nested", "items": [{"secret": "x-list"}, {"text": "ok"}]},
        "secret": "top-level",
    }
)
SHOWN = {
    "order": 7,
    "card": "***",
    "note": {"secret": "***", "items": [{"secret": "***"}, {"text": "ok"}]},
    "secret": "***",
}


def test_policy_names_and_secret_are_hidden_at_any_depth() -> None:
    assert shown_arguments(STORED, ("card",)) == SHOWN
    assert shown_arguments(json.loads(STORED), ("card",)) == SHOWN


def test_text_that_is_not_an_object_shows_as_nothing() -> None:
    assert shown_arguments("not json", ()) == {}
    assert shown_arguments("[1, 2]", ()) == {}


def test_flower_kwargs_show_the_same() -> None:
    text = redacted_kwargs_repr({"key": "s/t/c", "attempt": 1, "arguments": STORED}, ("card",))
    for secret in ("hunter2-nested", "x-list", "top-level"):
        assert secret not in text
    assert "s/t/c" in text
    plain = json.dumps({"order": 1})
    assert redacted_kwargs_repr({"arguments": plain}, ()) == repr({"arguments": plain})
