"""Call identity and the idempotency key (S2).

The key `session/turn/call` is what every attempt passes to the services it writes to, and
what a reconciler rebuilds from a record, so it must be unambiguous: no part may be empty,
contain `/`, contain control characters, or be longer than `MAX_ID_LENGTH`.
"""

from __future__ import annotations

import unicodedata
from dataclasses import dataclass

from dex_celery.errors import InvalidId

MAX_ID_LENGTH = 200
KEY_SEPARATOR = "/"
#: Separates the key from the attempt number in Celery task ids: `<key>#<attempt>`.
ATTEMPT_SEPARATOR = "#"
_FORBIDDEN = frozenset({KEY_SEPARATOR, ATTEMPT_SEPARATOR, "{", "}"})


def validate_id(kind: str, value: object) -> str:
    """Return `value` if it can be one part of a key, else raise `InvalidId` saying why.

    `#`, `{` and `}` are refused too: they delimit attempt numbers and Redis hash tags.
    """
    if not isinstance(value, str):
        raise InvalidId(f"{kind} must be a string, got {type(value).__name__}")
    if not value:
        raise InvalidId(f"{kind} must not be empty")
    if len(value) > MAX_ID_LENGTH:
        raise InvalidId(f"{kind} is {len(value)} characters long; the limit is {MAX_ID_LENGTH}")
    bad = sorted(_FORBIDDEN.intersection(value))
    if bad:
        raise InvalidId(
            f"{kind} {value!r} contains {' '.join(bad)!r}, which would make the key ambiguous"
        )
    # An ASCII value is printable exactly when it has no control character and no space other
    # than " " (the common case, checked in C); others are checked character by character.
    if not (value.isascii() and value.isprintable()) and any(
        unicodedata.category(ch).startswith("C") or (ch.isspace() and ch != " ") for ch in value
    ):
        raise InvalidId(f"{kind} {value!r} contains control characters")
    if value != value.strip():
        raise InvalidId(f"{kind} {value!r} has leading or trailing spaces")
    return value


@dataclass(frozen=True, slots=True, order=True)
class CallKey:
    """One tool call: (session id, turn id, tool-call id). Construct through `CallKey.of`."""

    session_id: str
    turn_id: str
    tool_call_id: str

    @classmethod
    def of(cls, session_id: object, turn_id: object, tool_call_id: object) -> CallKey:
        return cls(
            validate_id("session id", session_id),
            validate_id("turn id", turn_id),
            validate_id("tool-call id", tool_call_id),
        )

    @classmethod
    def parse(cls, key: object) -> CallKey:
        """The inverse of `str(key)`; refuses anything that is not exactly three valid parts."""
        if not isinstance(key, str):
            raise InvalidId(f"idempotency key must be a string, got {type(key).__name__}")
        parts = key.split(KEY_SEPARATOR)
        if len(parts) != 3:
            raise InvalidId(f"idempotency key {key!r} must be session/turn/call")
        return cls.of(*parts)

    def __str__(self) -> str:
        return KEY_SEPARATOR.join((self.session_id, self.turn_id, self.tool_call_id))

    @property
    def key(self) -> str:
        return str(self)

    def task_id(self, attempt: int) -> str:
        """The Celery task id of attempt `attempt`: deterministic, so Flower shows the key."""
        return f"{self}{ATTEMPT_SEPARATOR}{attempt}"


def parse_task_id(task_id: str) -> tuple[CallKey, int]:
    """`<key>#<attempt>` back into its parts; `InvalidId` for anything else."""
    key, sep, attempt = task_id.rpartition(ATTEMPT_SEPARATOR)
    if not sep or not attempt.isdigit() or int(attempt) < 1:
        raise InvalidId(f"task id {task_id!r} is not <session/turn/call>#<attempt>")
    return CallKey.parse(key), int(attempt)
