"""The scrubber's one rule for secrets of any shape (docs/secrets.md, "Scrubbing"): every string
and number leaf of a secret value, at any depth, of `MIN_SCRUB_LENGTH` characters or more, as
itself, its repr and its JSON form; shorter leaves, booleans, None and dict keys are left."""

from __future__ import annotations

import logging

import pytest

from dex_celery.tools.log_scrub import scrubbing
from dex_celery.tools.sealing import MIN_SCRUB_LENGTH, Scrubber, leaves

SECRETS = {
    "credentials": {
        "user": "bob",
        "password": 'pa"ss-word\\42',
        "keys": ["k1", ["deep-list-item"]],
        "pin": 73519024,
        "ratio": 0.123456,
        "on": True,
        "none": None,
    },
    "api_token": "tok-top-level",
}


def test_leaves_are_the_strings_and_numbers_at_any_depth() -> None:
    assert leaves(SECRETS["credentials"]) == [
        "bob",
        'pa"ss-word\\42',
        "k1",
        "deep-list-item",
        73519024,
        0.123456,
    ]


@pytest.mark.parametrize(
    "text",
    [
        'login failed: pa"ss-word\\42',
        "login failed: 'pa\"ss-word\\\\42'",  # the repr form
        'login failed: "pa\\"ss-word\\\\42"',  # the JSON form
        "pin 73519024 refused",
        "ratio 0.123456",
        "item deep-list-item",
        "token tok-top-level",
    ],
)
def test_each_long_enough_leaf_is_scrubbed_in_every_form(text: str) -> None:
    cleaned = Scrubber(SECRETS).text(text)
    for leaf in ('pa"ss-word', "73519024", "0.123456", "deep-list-item", "tok-top-level"):
        assert leaf not in cleaned
    assert "***" in cleaned


def test_short_leaves_keys_and_other_numbers_are_left() -> None:
    scrubber = Scrubber(SECRETS)
    assert len("bob") < MIN_SCRUB_LENGTH
    assert scrubber.text("user bob, keys k1, password field") == "user bob, keys k1, password field"
    # A result keeps its shape: secret leaves become ***, a number only on an exact match.
    value = {"pin": 73519024, "count": 7351902, "echo": "pw deep-list-item", "password": 1}
    assert scrubber.value(value) == {
        "pin": "***",
        "count": 7351902,
        "echo": "pw ***",
        "password": 1,
    }


def test_log_records_written_while_an_attempt_runs_are_scrubbed(
    caplog: pytest.LogCaptureFixture,
) -> None:
    log = logging.getLogger("tests.scrubber")
    with caplog.at_level(logging.INFO):
        with scrubbing(Scrubber(SECRETS)):
            log.info("logging in with %s", SECRETS["credentials"]["keys"])
            try:
                raise ValueError("bad pin 73519024")
            except ValueError:
                log.exception("tool raised")
        log.info("after the attempt: deep-list-item")  # no attempt runs: left as it is
    text = caplog.text
    assert "logging in with ['k1', ['***']]" in text
    assert "bad pin ***" in text
    assert "73519024" not in text
    assert "after the attempt: deep-list-item" in text
