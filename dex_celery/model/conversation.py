"""One conversation: an agent framework's history and the dex session are the same thing (S12.1).

A framework (Pydantic AI, LangGraph, the OpenAI Agents SDK) keeps its own message history. Two
things cross between it and the session, in both directions, and both are decided here from the
framework's history itself, never from a cursor kept beside it:

- **into dex**: the user and assistant messages that led to a call are copied into the session
  (`to_copy`), each under a key that names it in the framework's history: its role, its text and
  how many equal messages came before it. Seeing the same history again (a resumed run, the next
  call of the turn) copies nothing twice. Texts are scrubbed of the call's secrets and cut.
- **back to the model**: a user message written through dex (`send_user_message`, the
  reconciler's reports first of all) is handed to the framework once (`undelivered`). Whether it
  was is read from the framework's history: the n-th dex message with a given text is delivered
  when the history holds at least n user messages with that text. So a run that crashed before
  its history was saved hands it over again, and a history that holds it never gets it twice.
"""

from __future__ import annotations

import hashlib
import hmac
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

from dex_celery.model.records import Message, MessageRole

#: At most this many characters of one copied message are kept (the rest is cut, and says so).
COPIED_TEXT_LIMIT = 4000
#: At most this many of the latest user and assistant messages are copied at one call.
COPIED_MESSAGES_LIMIT = 100
#: The key of a framework message that carries a dex message, where the framework has a place
#: for it (Pydantic AI request metadata, a LangChain message id prefix).
DEX_MESSAGE_ID = "dex_message_id"


@dataclass(frozen=True, slots=True)
class SeenMessage:
    """A user or assistant message as an agent framework's history holds it (text only)."""

    role: MessageRole
    text: str


@dataclass(frozen=True, slots=True)
class CopiedMessage:
    """A framework message as the session keeps it: its key there, its role and shown text."""

    key: str
    role: MessageRole
    text: str


def cut(text: str, limit: int = COPIED_TEXT_LIMIT) -> str:
    if len(text) <= limit:
        return text
    return f"{text[:limit]}… [cut: {len(text) - limit:,} more characters]"


def message_key(role: MessageRole, text: str, occurrence: int, secret_key: str | None) -> str:
    """The identity of the `occurrence`-th message of `role` with `text` in one history.

    Keyed with the deployment's secret key when it has one: the text may hold a secret the
    scrubbing did not know yet, and an unkeyed digest of a short secret can be searched."""
    material = f"{role.value}\0{occurrence}\0{text}".encode()
    return hmac.new((secret_key or "dex-celery").encode(), material, hashlib.sha256).hexdigest()[
        :48
    ]


def to_copy(
    history: Sequence[SeenMessage],
    sent: Iterable[str],
    secret_key: str | None,
    scrub: Callable[[str], str],
) -> list[CopiedMessage]:
    """The messages of `history` the session keeps, oldest first: user and assistant texts,
    less the user messages that are dex's own messages handed to the framework (`sent`, the
    texts of the session's messages written through dex)."""
    handed = Counter(sent)
    seen: Counter[tuple[MessageRole, str]] = Counter()
    out: list[CopiedMessage] = []
    for message in history:
        if message.role not in (MessageRole.USER, MessageRole.ASSISTANT) or not message.text:
            continue
        if message.role is MessageRole.USER and handed[message.text] > 0:
            handed[message.text] -= 1
            continue
        seen[(message.role, message.text)] += 1
        occurrence = seen[(message.role, message.text)]
        out.append(
            CopiedMessage(
                message_key(message.role, message.text, occurrence, secret_key),
                message.role,
                cut(scrub(message.text)),
            )
        )
    return out[-COPIED_MESSAGES_LIMIT:]


def undelivered(sent: Sequence[Message], user_texts: Iterable[str]) -> list[Message]:
    """The messages of `sent` (user messages written through dex, oldest first) that the
    framework's history, whose user messages are `user_texts`, does not hold yet."""
    held = Counter(user_texts)
    out = []
    for message in sent:
        text = message.text or ""
        if held[text] > 0:
            held[text] -= 1
        else:
            out.append(message)
    return out
