"""The rules of one conversation (S12.1, model/conversation.py): what a framework's history
gives the session, and which of dex's own user messages the history still lacks."""

from __future__ import annotations

from dex_celery.model.conversation import (
    COPIED_MESSAGES_LIMIT,
    COPIED_TEXT_LIMIT,
    SeenMessage,
    to_copy,
    undelivered,
)
from dex_celery.model.records import Message, MessageRole

USER, ASSISTANT, TOOL = MessageRole.USER, MessageRole.ASSISTANT, MessageRole.TOOL


def _same(text: str) -> str:
    return text


def _sent(*texts: str) -> list[Message]:
    return [Message(USER, text, id=n) for n, text in enumerate(texts, start=1)]


def test_a_history_seen_again_gives_the_same_keys() -> None:
    history = [SeenMessage(USER, "refund 1002"), SeenMessage(ASSISTANT, "On it.")]
    first = to_copy(history, [], "k", _same)
    longer = to_copy([*history, SeenMessage(USER, "thanks")], [], "k", _same)
    assert [c.key for c in longer[:2]] == [c.key for c in first]
    assert [(c.role, c.text) for c in first] == [(USER, "refund 1002"), (ASSISTANT, "On it.")]


def test_equal_messages_are_kept_apart_by_their_order() -> None:
    history = [SeenMessage(USER, "yes"), SeenMessage(ASSISTANT, "ok"), SeenMessage(USER, "yes")]
    copied = to_copy(history, [], "k", _same)
    assert len({c.key for c in copied}) == 3
    # The key does not depend on where in the list the message sits, only on what came before
    # it of the same role and text: a message inserted elsewhere does not re-key the rest.
    shifted = to_copy([SeenMessage(ASSISTANT, "hello"), *history], [], "k", _same)
    assert {c.key for c in copied} <= {c.key for c in shifted}


def test_dex_messages_handed_to_the_framework_are_not_copied_back() -> None:
    history = [SeenMessage(USER, "refund 1002"), SeenMessage(USER, "the report"),
               SeenMessage(USER, "did it work?")]  # fmt: skip
    copied = to_copy(history, ["the report"], "k", _same)
    assert [c.text for c in copied] == ["refund 1002", "did it work?"]


def test_copies_are_scrubbed_cut_and_bounded_and_keys_are_keyed() -> None:
    history = [SeenMessage(USER, "card 4111 " + "x" * (COPIED_TEXT_LIMIT + 10))]
    (copied,) = to_copy(history, [], "k", lambda t: t.replace("4111", "***"))
    assert copied.text.startswith("card *** ") and "[cut:" in copied.text
    assert "4111" not in copied.key
    assert to_copy(history, [], "other", _same)[0].key != copied.key
    many = [SeenMessage(USER, f"m{n}") for n in range(COPIED_MESSAGES_LIMIT + 5)]
    assert len(to_copy(many, [], "k", _same)) == COPIED_MESSAGES_LIMIT
    tools_and_blanks = [SeenMessage(TOOL, "out"), SeenMessage(USER, "")]
    assert to_copy(tools_and_blanks, [], "k", _same) == []


def test_each_dex_message_is_delivered_once_by_what_the_history_holds() -> None:
    sent = _sent("report A", "report B", "report A")
    assert [m.id for m in undelivered(sent, [])] == [1, 2, 3]
    assert [m.id for m in undelivered(sent, ["hello", "report A"])] == [2, 3]
    assert [m.id for m in undelivered(sent, ["report A", "report B", "report A"])] == []
    # A history restored from before the report was handed over gets it again (not lost).
    assert [m.id for m in undelivered(_sent("report A"), ["hello"])] == [1]
