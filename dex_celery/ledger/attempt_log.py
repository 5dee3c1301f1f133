"""The one codec of the attempt log: a JSON array, written by the ledger scripts
(`_common.lua`'s `log_attempt`) and kept unchanged in SQL's `attempt_log` column."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True, slots=True)
class AttemptLogEntry:
    """One ended attempt: who claimed it, when, how it ended and with which error."""

    attempt: int
    state: str
    owner: str
    claimed_at: float | None
    ended_at: float
    error: str = ""


def parse_attempt_log(text: str | None) -> tuple[AttemptLogEntry, ...]:
    """Entries of a log; an empty or missing log has none."""
    if not text:
        return ()
    raw: Any = json.loads(text)
    if not isinstance(raw, list):  # Redis's cjson encodes an empty table as {}
        return ()
    return tuple(
        AttemptLogEntry(
            attempt=int(item["attempt"]),
            state=str(item["state"]),
            owner=str(item.get("owner") or ""),
            claimed_at=float(item["claimed_at"]) if item.get("claimed_at") is not None else None,
            ended_at=float(item["ended_at"]),
            error=str(item.get("error") or ""),
        )
        for item in raw
    )
