"""What one audit entry is, and the hash that chains it (docs/audit.md, S13.4).

An entry is a decision: its kind, the call and session it is about (if any), when, and a body of
plain facts (JSON). A writer's entries form a chain: each entry's hash is the SHA-256 of the
previous entry's hash and of the entry's own canonical text, so changing, removing, adding or
moving one entry changes every hash after it. Bodies hold no secret values: arguments and
results appear as digests, and a call's arguments as the record keeps them (`***` for secrets,
docs/secrets.md), never sealed values.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

#: The `prev` of a chain's first entry.
GENESIS = "0" * 64


class AuditKind(StrEnum):
    CALL_REQUESTED = "call_requested"
    APPROVAL_ASKED = "approval_asked"
    APPROVAL_DECIDED = "approval_decided"
    APPROVAL_EDITED = "approval_edited"
    APPROVAL_EXPIRED = "approval_expired"
    FREEZE = "freeze"
    THAW = "thaw"
    BUDGET_RESERVED = "budget_reserved"
    BUDGET_SPENT = "budget_spent"
    BUDGET_HELD = "budget_held"
    BUDGET_RELEASED = "budget_released"
    ATTEMPT_CLAIMED = "attempt_claimed"
    ATTEMPT_STARTED = "attempt_started"
    ATTEMPT_ENDED = "attempt_ended"
    OUTCOME = "outcome"
    LATE_RESULT = "late_result"
    REPORT_SENT = "report_sent"
    HISTORY_PRUNED = "history_pruned"


@dataclass(frozen=True, slots=True)
class Entry:
    """One decision to append (`AuditLog.append`); `at` defaults to the time it is appended."""

    kind: AuditKind
    body: Mapping[str, Any] = field(default_factory=dict)
    call_key: str | None = None
    session_id: str | None = None
    at: float | None = None


@dataclass(frozen=True, slots=True)
class Chained:
    """An entry as stored: its place in its writer's chain, its hash and (the last of a
    transaction's) signature."""

    writer: str
    seq: int
    at: float
    kind: str
    call_key: str | None
    session_id: str | None
    body: str
    prev: str
    hash: str
    signature: str | None = None
    key_id: str | None = None

    def expected_hash(self) -> str:
        return entry_hash(
            self.prev,
            self.writer,
            self.seq,
            self.at,
            self.kind,
            self.call_key,
            self.session_id,
            self.body,
        )

    def as_dict(self) -> dict[str, Any]:
        return {
            "writer": self.writer,
            "seq": self.seq,
            "at": self.at,
            "kind": self.kind,
            "call_key": self.call_key,
            "session_id": self.session_id,
            "body": self.body,
            "prev": self.prev,
            "hash": self.hash,
            "signature": self.signature,
            "key_id": self.key_id,
        }

    @classmethod
    def of(cls, row: Mapping[Any, Any]) -> Chained:
        return cls(
            writer=str(row["writer"]),
            seq=int(row["seq"]),
            at=float(row["at"]),
            kind=str(row["kind"]),
            call_key=row["call_key"],
            session_id=row["session_id"],
            body=str(row["body"]),
            prev=str(row["prev"]),
            hash=str(row["hash"]),
            signature=row["signature"],
            key_id=row["key_id"],
        )

    def label(self) -> str:
        """How findings name the entry: writer, place, kind and call."""
        about = f" {self.call_key}" if self.call_key else ""
        return f"{self.writer}#{self.seq} ({self.kind}{about})"


_ENCODE = json.JSONEncoder(sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode


def canonical(value: Any) -> str:
    """JSON with sorted keys and no spaces: one text per value, so one hash."""
    return _ENCODE(value)


def entry_hash(
    prev: str,
    writer: str,
    seq: int,
    at: float,
    kind: str,
    call_key: str | None,
    session_id: str | None,
    body: str,
) -> str:
    """SHA-256 of the entry's fields, `|`-separated (the call key and session, which may hold
    any character, prefixed by their length; `at` as `repr` writes it, exactly), a newline,
    then its body."""
    key = "-" if call_key is None else f"{len(call_key)}:{call_key}"
    session = "-" if session_id is None else f"{len(session_id)}:{session_id}"
    text = f"{prev}|{writer}|{seq}|{at!r}|{kind}|{key}|{session}\n{body}"
    return hashlib.sha256(text.encode()).hexdigest()


def digest(text: str | None) -> str | None:
    """A value's SHA-256 (what an entry keeps of arguments, results and errors), None for none."""
    if text is None:
        return None
    return hashlib.sha256(text.encode()).hexdigest()


def checkpoint_digest(writer: str, seq: int, chain_hash: str, cut_at: float) -> str:
    """What a prune's checkpoint signs: the chain, the place it was cut and its hash there."""
    return hashlib.sha256(
        canonical(["checkpoint", writer, seq, chain_hash, cut_at]).encode()
    ).hexdigest()
