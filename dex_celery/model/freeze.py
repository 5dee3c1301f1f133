"""The write freeze (S13.2): values and the texts people and the model read.

An operator stops every write of a deployment (or of some tools) in one move, while reads go
on: `dex-celery -A APP writes freeze --reason TEXT [--tool T ...] [--reject]`. A freeze is one
row of history in SQL (who, when, why; the durable record) and, while it lasts, one field of a
key in every ledger shard that `claim.lua` reads, so no write is claimed once the command has
returned (docs/guardrails.md, "Write freeze").

Which classes a freeze stops is one rule, `frozen_classes`: every class whose tool may change
the world (`EffectTraits.read_only` false): `non_idempotent_write`, `unclassified` and
`idempotent_write` too, since an idempotent write still writes the first time. Reads never.
"""

from __future__ import annotations

import json
import unicodedata
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from dex_celery.errors import InvalidFreeze
from dex_celery.model.effects import EffectClass
from dex_celery.model.ids import MAX_ID_LENGTH
from dex_celery.model.times import format_utc

#: The scope of a freeze of every tool (a tool's name cannot be `*`: tools/tool.py names).
ALL_TOOLS = "*"
#: Longest reason a freeze keeps (it is shown on every page and in each held call's reason).
MAX_REASON_CHARS = 500


class FreezeMode(StrEnum):
    """What happens to a write claimed while frozen."""

    #: It waits for a person (S6), with the freeze's reason; a thaw lets it run.
    HOLD = "hold"
    #: It ends `rejected`, with a text the model can act on; it never runs.
    REJECT = "reject"


def frozen_classes() -> tuple[str, ...]:
    """The effect classes a freeze stops: every class that is not read-only (S1.2)."""
    return tuple(sorted(c.value for c in EffectClass if not c.traits.read_only))


@dataclass(frozen=True, slots=True)
class WriteFreeze:
    """One freeze in force (or, with `thawed_at`, one that was): a row of `dex_write_freezes`."""

    id: int
    #: A tool's name, or `ALL_TOOLS`.
    tool: str
    mode: FreezeMode
    reason: str
    frozen_by: str
    #: When it began, on the ledger's clock (S10.1).
    since: float
    thawed_by: str | None = None
    thawed_at: float | None = None

    @property
    def scope_text(self) -> str:
        return "every tool" if self.tool == ALL_TOOLS else f"tool {self.tool}"

    def ledger_entry(self) -> dict[str, Any]:
        """What `claim.lua` reads of this freeze (`ledger/freeze.ledger_copy`)."""
        return {
            "id": self.id,
            "mode": self.mode.value,
            "classes": list(frozen_classes()),
            "reason": self.reason,
            "by": self.frozen_by,
            "since": self.since,
            "tool": self.tool,
        }

    def as_dict(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "tool": self.tool,
            "mode": self.mode.value,
            "reason": self.reason,
            "frozen_by": self.frozen_by,
            "since": self.since,
            "thawed_by": self.thawed_by,
            "thawed_at": self.thawed_at,
        }

    def line(self) -> str:
        """One line for `writes status`, `status` and the web app's banner."""
        verb = "held for approval" if self.mode is FreezeMode.HOLD else "rejected"
        return (
            f"writes of {self.scope_text} frozen by {self.frozen_by} since "
            f"{format_utc(self.since, millis=False)} (new writes are {verb}): {self.reason}"
        )


def held_reason(freeze: WriteFreeze) -> str:
    """Why a held call waits, as every approval surface shows it."""
    return (
        f"writes are frozen ({freeze.scope_text}) by {freeze.frozen_by} since "
        f"{format_utc(freeze.since, millis=False)}: {freeze.reason}. It runs when writes are "
        "thawed, or earlier if a person approves it"
    )


def rejected_text(freeze: WriteFreeze, *, may_have_run: bool = False) -> str:
    """The error of a call a `--reject` freeze turned away: what the model reads. `may_have_run`:
    an earlier attempt of the call (a retried idempotent write) reached a worker."""
    ran = (
        "an earlier attempt of this call reached a worker and may have taken effect"
        if may_have_run
        else "the tool did not run"
    )
    return (
        f"rejected by a write freeze: {ran}. Writes are frozen ({freeze.scope_text}) by "
        f"{freeze.frozen_by} since {format_utc(freeze.since, millis=False)}: {freeze.reason}. "
        "Do not retry this write while writes are frozen; tell the user it was not made, or "
        "go on with reads only"
    )


def check_text(what: str, text: str | None, *, limit: int, required: bool = True) -> str:
    """Validate an operator's name, reason or tool before anything is written (S9.3)."""
    if text is None or not isinstance(text, str) or not text.strip():
        if required:
            raise InvalidFreeze(f"a freeze needs {what}")
        return ""
    text = text.strip()
    if len(text) > limit:
        raise InvalidFreeze(f"{what} is {len(text)} characters long; the limit is {limit}")
    if any(unicodedata.category(ch) in ("Cc", "Cs", "Cn") for ch in text):
        raise InvalidFreeze(f"{what} holds a control character or text that is not Unicode")
    return text


def check_operator(name: str | None) -> str:
    return check_text("the name of who acts (--by)", name, limit=MAX_ID_LENGTH)


def parse_entry(text: str) -> WriteFreeze:
    """A freeze as `claim.lua` answered it (the ledger entry's JSON)."""
    data = json.loads(text)
    return WriteFreeze(
        id=int(data["id"]),
        tool=str(data.get("tool", ALL_TOOLS)),
        mode=FreezeMode(data["mode"]),
        reason=str(data["reason"]),
        frozen_by=str(data["by"]),
        since=float(data["since"]),
    )
