"""A call's first attempt: opened in the ledger, then published (docs/ledger.md, "Opening a
call").

`Opener.start_new` opens the new calls of one request in one round trip (and, where the broker is
the ledger's own Redis, publishes their messages in the same step); `Opener.start` opens one
call (the sweeper's orphans, an approved call, a call a write freeze held). Both open only what
the system of record still has in flight, under the ledger's current life (`epoch.py`), with
the call's write budgets reserved in the same step (`budget_admission.py`). Publishing, and
acting on a publish the broker refused, is `engine/steps.py`.
"""

from __future__ import annotations

import functools
import json
import logging
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from dex_celery.engine import tracing
from dex_celery.engine.request.budget_admission import charge_args, needs_rebuild, over_budget
from dex_celery.engine.request.publish_capture import can_capture, capture
from dex_celery.engine.steps import AttemptMessage, Steps, claimed_write
from dex_celery.ledger.ledger import BrokerCommand, OpenResult
from dex_celery.model.outcomes import CallStatus
from dex_celery.model.records import ToolCallRecord
from dex_celery.settings import Settings
from dex_celery.store.repository import Store

if TYPE_CHECKING:
    from celery import Celery

    from dex_celery.engine.epoch import LedgerEpoch
    from dex_celery.ledger.ledger import Ledger

log = logging.getLogger("dex_celery.engine.request.opening")


class Opener:
    """Opens and publishes first attempts; one per process, built by `runtime`."""

    def __init__(
        self,
        celery: Celery,
        ledger: Ledger,
        store: Store,
        epoch: LedgerEpoch,
        steps: Steps,
        settings: Settings,
    ) -> None:
        self.celery = celery
        self.ledger = ledger
        self.store = store
        self.epoch = epoch
        self.steps = steps
        self.settings = settings
        #: Whether first attempts are published by the ledger's open (decided at the first
        #: request: the broker's channel tells, `request/publish_capture.py`).
        self._capturing: bool | None = None

    def start_new(
        self,
        records: Sequence[ToolCallRecord],
        arguments: Mapping[str, Mapping[str, Any]],
        sealed: Mapping[str, str | None],
    ) -> dict[str, ToolCallRecord]:
        """Open the new calls of one request in one round trip, then publish each.

        A requester that stalled after its insert for a good part of the orphan grace may find
        that the sweeper started (and even finished) these calls meanwhile: those go through
        `start`, which opens only what the database still has in flight.
        """
        now = self.ledger.now()
        late = {r.key for r in records if now - r.requested_at > self.settings.orphan_grace / 2}
        for record in records:
            if record.key in late:
                self.start(record, arguments[record.key])
        records = [r for r in records if r.key not in late]
        if not records:
            return {}
        messages = [
            AttemptMessage(
                record.tool_name,
                record.key,
                arguments[record.key],
                record.policy,
                sealed[record.key],
                tracing.loads(record.trace_context),
            )
            for record in records
        ]
        calls = [(r.key, r.policy) for r in records]
        budgets = [charge_args(self.ledger, r) if r.budgets else () for r in records]
        with self.celery.producer_or_acquire() as producer:  # one producer for the batch
            sends = self._captured(messages, producer)
            # With `sends`, each open publishes its own message when it opens the call: opening
            # and publishing are one atomic step, one round trip for the batch; so are its
            # budgets' reservations (S13.1).
            replies = self.ledger.open_replies(
                calls,
                epoch=self.epoch.current(),
                sends=sends,
                budgets=budgets if any(budgets) else None,
            )
            if sends is None:
                for message, reply in zip(messages, replies, strict=True):
                    if reply.result is OpenResult.OPENED:
                        self.steps.publish(message, attempt=1, producer=producer)
        moved: dict[str, ToolCallRecord] = {}
        for record, reply in zip(records, replies, strict=True):
            result = reply.result
            if result in (OpenResult.EPOCH_CHANGED, OpenResult.REBUILD):
                # Refreshes the epoch, or counts a budget from SQL, and reopens.
                now_record = self.start(record)
                if now_record is not None:
                    moved[record.key] = now_record
            elif result is OpenResult.OVER_BUDGET:
                now_record = over_budget(self.ledger, self.store, record, reply)
                if now_record is not None:
                    moved[record.key] = now_record
            elif result is OpenResult.EXISTS:
                log.info("call %s already has a ledger entry; not publishing", record.key)
        return moved

    def _captured(
        self, messages: Sequence[AttemptMessage], producer: Any
    ) -> list[list[BrokerCommand]] | None:
        """The broker commands of each first attempt, for the ledger's open to run, where the
        broker is the ledger's own Redis (`publish_capture.py`); None where it is not, or where
        any message cannot be taken that way (each is then published after its open)."""
        if self._capturing is None:
            self._capturing = can_capture(
                producer,
                self.celery.conf.broker_url,
                self.settings.redis_url,
                self.ledger.may_publish,
            )
        if not self._capturing:
            return None
        sends: list[list[BrokerCommand]] = []
        for message in messages:
            commands = capture(producer, functools.partial(self.steps.send, message, 1))
            if commands is None:
                return None
            sends.append(commands)
        return sends

    def start(
        self,
        record: ToolCallRecord,
        arguments: Mapping[str, Any] | None = None,
        *,
        may_have_run: bool = False,
    ) -> ToolCallRecord | None:
        """Open attempt 1 and publish it. Safe to call twice: only one open succeeds.

        `may_have_run`: the call was open in a ledger that lost its data (see `Ledger.open`).
        Returns the record as it became when a write budget had too little left (it waits for a
        person, or was rejected: S13.1); None otherwise.
        """
        ledger = self.ledger
        current = self._may_open(record)
        if current is None:
            return None
        # The record as the database has it now: a person's approval admits it over budget.
        record = current
        # A call that waited for approval announced its request already.
        announce = record.approval is None
        # A person's approval lets the call pass a write freeze begun before it (S13.2).
        approval = record.approval
        passed = approval.decided_at if approval and approval.decision == "approved" else None
        budgets = charge_args(ledger, record) if record.budgets else ()
        refresh = False
        for _ in range(4):
            epoch = self.epoch.current(refresh=refresh)
            (reply,) = ledger.open_replies(
                [(record.key, record.policy)],
                epoch=epoch,
                announce=announce,
                may_have_run=may_have_run,
                budgets=[budgets] if budgets else None,
                passed=passed,
            )
            if reply.result is OpenResult.EPOCH_CHANGED:
                # The ledger started a new life since this process last looked (the one place an
                # epoch change is handled when opening): open the call under the epoch in force.
                # A write still runs only after its claim in SQL, so this cannot run it twice.
                refresh = True
            elif reply.result is OpenResult.REBUILD:
                needs_rebuild(ledger, self.store, epoch, record, reply)
            else:
                break
        if reply.result is OpenResult.OVER_BUDGET:
            return over_budget(ledger, self.store, record, reply)
        if reply.result is not OpenResult.OPENED:
            log.info(
                "call %s already has a ledger entry (%s); not publishing", record.key, reply.result
            )
            return None
        if arguments is None:
            arguments = json.loads(record.arguments)
        message = AttemptMessage(
            record.tool_name,
            record.key,
            arguments,
            record.policy,
            record.sealed_arguments,
            tracing.loads(record.trace_context),
            approved=record.approved_digest is not None,
        )
        self.steps.publish(message, attempt=1)
        return None

    def _may_open(self, record: ToolCallRecord) -> ToolCallRecord | None:
        """Open only what the system of record still has in flight (and, for a write, not yet
        claimed): a requester or sweeper acting on an old read of the record must not start a
        call that has ended or whose write was claimed meanwhile (docs/ledger.md). Returns the
        record as it is now, or None."""
        current = self.store.get_call(record.key)
        if current is None or current.status is not CallStatus.PENDING:
            log.info("call %s is no longer pending in the database; not opening it", record.key)
            return None
        if claimed_write(current):
            log.warning("write %s was claimed already; not opening it again", record.key)
            return None
        return current
