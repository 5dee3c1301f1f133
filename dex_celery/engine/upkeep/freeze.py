"""The write freeze (S13.2): an operator stops every write in one move; reads go on.

`freeze` records the freeze in SQL (the durable record: who, when, why), then writes it into
every ledger shard's freeze hash, which `claim.lua` reads in the same script as every claim: once
`freeze` returns, no write is claimed, including writes requested before it and not yet claimed
(a write already claimed runs on). A claim the freeze refuses takes the call's entry out of the
ledger; the worker then holds the call for a person (S6, with the freeze's reason) or, for a
freeze with `reject`, ends it `rejected` with a text the model can act on (`on_frozen`).

`thaw` records the thaw, clears the ledger's copy, then releases the held calls in request order
(`WriteFreezes.release`): each goes back to `pending` and is opened and published as a call
whose approval arrived, so it runs without a person unless it needed one anyway (a call that
needed approval was never opened, so never held).

The ledger's copy may vanish with Redis (a restart from an older snapshot, a replaced server):
`sync` re-asserts it from SQL, conservatively (SQL's freezes win), at every sweep and before any
process starts a new ledger life (`ledger/guard.py`). docs/guardrails.md, "Write freeze".
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from dex_celery.errors import FreezeNotInLedger, InvalidFreeze
from dex_celery.ledger.freeze import ledger_copy, reassert
from dex_celery.ledger.ledger import Claim
from dex_celery.model.event_types import EventType
from dex_celery.model.freeze import (
    ALL_TOOLS,
    MAX_REASON_CHARS,
    FreezeMode,
    WriteFreeze,
    check_operator,
    check_text,
    held_reason,
    parse_entry,
    rejected_text,
)
from dex_celery.model.ids import MAX_ID_LENGTH
from dex_celery.model.outcomes import CallStatus
from dex_celery.model.records import ApprovalDecision
from dex_celery.store.freezes import HeldCall, Hold, WriteFreezes
from dex_celery.store.values import Outcome

if TYPE_CHECKING:
    from dex_celery.engine.request import Opener
    from dex_celery.ledger.ledger import Ledger
    from dex_celery.store.repository import Store
    from dex_celery.tools.tool import Tool

log = logging.getLogger("dex_celery.engine.upkeep.freeze")

#: Who decided a call a `--reject` freeze turned away (the freeze's operator follows).
REJECTED_BY = "system: write freeze by "


@dataclass(frozen=True, slots=True)
class Thaw:
    """What a thaw did: the freezes it ended, the held calls it let run (in request order),
    and the freezes still in force (another scope)."""

    thawed: tuple[WriteFreeze, ...]
    released: tuple[str, ...]
    still_frozen: tuple[WriteFreeze, ...]


class WriteFreezeControl:
    """Freeze, thaw and report; hold or reject what a frozen claim turned away. One per process
    (`runtime`)."""

    def __init__(
        self,
        store: Store,
        ledger: Ledger,
        opener: Opener,
        tools: Mapping[str, Tool],
    ) -> None:
        self.store = store
        self.ledger = ledger
        self.opener = opener
        self.tools = tools
        self.freezes = WriteFreezes(lambda: store.engine, store.audit)

    # --- the operator's moves --------------------------------------------------------------------

    def freeze(
        self, *, reason: str, by: str, tools: Sequence[str] = (), reject: bool = False
    ) -> list[WriteFreeze]:
        """Freeze writes of `tools` (none: every tool). Everything is checked before anything is
        written (S9.3). Returns only once the ledger holds the freeze: from then on no write is
        claimed. If Redis cannot be told, the freeze is in SQL and the error says so; the
        sweeper re-asserts it."""
        reason = check_text("a reason (--reason)", reason, limit=MAX_REASON_CHARS)
        by = check_operator(by)
        scopes = self._scopes(tools)
        mode = FreezeMode.REJECT if reject else FreezeMode.HOLD
        made = self.freezes.begin(scopes, mode, reason, by, self.ledger.now())
        self._tell_ledger("the freeze is recorded in the database")
        for f in made:
            self._announce(EventType.WRITES_FROZEN, f, by)
        return made

    def thaw(self, *, by: str, tools: Sequence[str] | None = None) -> Thaw:
        """End the freezes of `tools` (None: all), then let the calls they held run, in
        request order."""
        by = check_operator(by)
        scopes = None if tools is None or not tools else self._scopes(tools)
        thawed = self.freezes.end(scopes, by, self.ledger.now())
        self._tell_ledger("the thaw is recorded in the database")
        for f in thawed:
            self._announce(EventType.WRITES_THAWED, f, by)
        released = self.release_held()
        return Thaw(tuple(thawed), tuple(h.record.key for h in released), tuple(self.status()))

    def status(self) -> list[WriteFreeze]:
        """The freezes in force (SQL's record), oldest first."""
        return self.freezes.active()

    def history(self, *, limit: int = 20) -> list[WriteFreeze]:
        return self.freezes.history(limit=limit)

    def sync(self) -> bool:
        """Re-assert the ledger's copy from SQL (`reassert`); the sweeper runs it each sweep."""
        return reassert(self.ledger, self.freezes)

    def release_held(self) -> list[HeldCall]:
        """Let every held call no freeze in force covers run, oldest request first."""
        still = [f.tool for f in self.freezes.active()]
        return self.freezes.release(still, self.ledger.now(), self._start)

    def _start(self, held: HeldCall) -> None:
        try:
            self.opener.start(held.record, may_have_run=held.may_have_run)
        except Exception:
            # Pending in SQL with no ledger entry (released, or never held): the sweeper's
            # orphan check opens and publishes it. Nothing ran.
            log.exception("could not dispatch %s (pending); the sweeper will", held)

    # --- the worker's side -----------------------------------------------------------------------

    def on_frozen(self, key: str, claim: Claim) -> None:
        """A claim the freeze refused (its entry left the ledger): hold the call for a person, or
        reject it. If the database is away, the call stays `pending` without a ledger entry and
        the sweeper's orphan check opens it again, to meet the freeze again."""
        freeze = parse_entry(claim.freeze)
        now = self.ledger.now()
        record = self.store.get_call(key)
        if record is None:
            log.warning("a frozen claim of %s, which the database does not know", key)
            return
        if freeze.mode is FreezeMode.REJECT:
            self._reject(key, freeze, claim.reached, now)
            return
        deadline = now + record.policy.approval_timeout
        held = self.freezes.hold(
            key, freeze, deadline=deadline, may_have_run=claim.reached, now=now
        )
        if held is Hold.MOVED_ON:
            log.info("call %s moved on before the freeze could hold it", key)
            return
        if held is Hold.THAWED:
            # The freeze ended between the claim and the hold: no thaw will see this call, so
            # open it again here (the ledger's copy of a freeze in force refuses it again).
            log.info(
                "call %s: the freeze %d ended before it was held; opened again", key, freeze.id
            )
            self._start(HeldCall(record, may_have_run=claim.reached))
            return
        log.info("call %s held by the write freeze %d", key, freeze.id)
        self.ledger.events.publish(
            EventType.TOOL_CALL_AWAITING_APPROVAL,
            key,
            deadline=str(deadline),
            repeat_of="",
            reason=held_reason(freeze),
        )

    def _reject(self, key: str, freeze: WriteFreeze, reached: bool, now: float) -> None:
        text = rejected_text(freeze, may_have_run=reached)
        decision = ApprovalDecision("rejected", REJECTED_BY + freeze.frozen_by, now, freeze.reason)
        done = self.store.record_outcome(
            key, Outcome(CallStatus.REJECTED, text, did_not_run=not reached), decision=decision
        )
        if done:
            events = self.ledger.events
            events.publish(
                EventType.TOOL_CALL_DECIDED, key, decision="rejected", by=decision.decided_by
            )
            events.publish_finished(key, status=CallStatus.REJECTED.value, error=text)

    # --- helpers ---------------------------------------------------------------------------------

    def _scopes(self, tools: Sequence[str]) -> list[str]:
        if not tools:
            return [ALL_TOOLS]
        scopes: list[str] = []
        for tool in tools:
            name = check_text("a tool name (--tool)", tool, limit=MAX_ID_LENGTH)
            if name != ALL_TOOLS and name not in self.tools:
                known = ", ".join(sorted(self.tools)) or "none"
                raise InvalidFreeze(f"no tool named {name!r} is registered (known: {known})")
            if name not in scopes:
                scopes.append(name)
        return scopes

    def _tell_ledger(self, done: str) -> None:
        try:
            self.ledger.set_freezes(ledger_copy(self.freezes.active()))
        except Exception as e:
            raise FreezeNotInLedger(
                f"{done}, but the ledger (Redis) could not be told ({e}); the sweeper makes the "
                "ledger agree with the database at its next sweep (`dex-celery sweep` does it "
                "now), and until then the ledger still answers claims as before"
            ) from e

    def _announce(self, event: EventType, freeze: WriteFreeze, by: str) -> None:
        try:
            self.ledger.events.publish(
                event,
                "",
                freeze=str(freeze.id),
                tool=freeze.tool,
                mode=freeze.mode.value,
                by=by,
                reason=freeze.reason,
            )
        except Exception:  # the record is in SQL; only the announcement is lost
            log.warning("could not announce %s of freeze %d", event.value, freeze.id)
