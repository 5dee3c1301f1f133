"""Reconciling `outcome_unknown` calls (S8): the seed's function, a check registry, a beat job.

An `outcome_unknown` call may or may not have taken effect, and the session never runs it again.
Only the service the tool wrote to can say what happened, so a tool declares an *outcome check*:
`(idempotency key, arguments as JSON) -> report text`, or `CannotTellYet(...)` when the service
cannot answer now. The answer goes to the session as a user message written as a note from the
application (S8.1), ending in `(tool call <key>)`: that marker is how every later run, and the
seed's own function, knows the call was reported (S8.2).

- `report_unknown_outcomes(sessions, session_id, check)`: the seed's example as a library
  function, for a support tool or a job that handles one session (async, S8.3 shape).
- `OutcomeChecks` (`dex.outcome_check(tool)` / `dex.register_outcome_check(tool, check)`): the
  registry the beat job reads.
- `Reconciler` (built by the runtime): `reconcile_call` is the one per-call step; `run_once`
  (and `reconcile_once(dex)`) is one run of the beat job (Celery task `dex.reconcile`, S8.4). It
  surfaces every new unknown call once (a log line with the key, a
  `tool_call_outcome_unknown_surfaced` event, a count), runs the registered checks, and reports
  each answer once. A check that raises or answers nonsense is logged and asked again next run;
  it never stops the others. Calls of tools without a check stay open for a person.
"""

from __future__ import annotations

import inspect
import logging
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import asdict, dataclass, field
from enum import StrEnum
from typing import Any, Protocol, TypeVar

from dex_celery.async_bridge import run_sync
from dex_celery.backend_errors import translating_backend_errors
from dex_celery.engine.held_back_evidence import RECONCILED, announce_repeat_evidence
from dex_celery.errors import (
    ConfigurationError,
    DuplicateOutcomeCheck,
    InvalidCheckResult,
    UnknownCall,
)
from dex_celery.ledger.events import AgentEvents
from dex_celery.model.event_types import EventType
from dex_celery.model.ids import CallKey, validate_id
from dex_celery.model.message_text import check_text
from dex_celery.model.outcomes import OUTCOME_UNKNOWN_TOOL_RESULT, CallStatus
from dex_celery.model.records import AgentSnapshot, Message, MessageRole, ToolCallRecord
from dex_celery.model.report_text import already_reported, format_report
from dex_celery.settings import DEFAULT_CHECK_TIMEOUT, Settings
from dex_celery.store.budgets import DID_NOT_RUN, WENT_THROUGH
from dex_celery.store.repository import Store
from dex_celery.store.unknowns import UnknownOutcomes

log = logging.getLogger("dex_celery.engine.upkeep.reconcile")

#: Celery task name of the reconcile beat job.
RECONCILE_TASK = "dex.reconcile"


@dataclass(frozen=True, slots=True)
class CannotTellYet:
    """What a check returns when the service cannot answer now; it is asked again next run."""

    reason: str = ""


class WentThrough(str):
    """Report text that also says the call took effect: its held write budgets are spent
    (S13.1)."""

    __slots__ = ()


class DidNotRun(str):
    """Report text that also says the call did not take effect: its held write budgets are
    released, usable by the next call (S13.1)."""

    __slots__ = ()


CheckAnswer = str | CannotTellYet
#: The seed's type: (idempotency key, tool arguments as JSON) -> report text.
OutcomeCheck = Callable[[str, str], Awaitable[str]]
#: What the registry accepts: sync or async, text or `CannotTellYet`.
AnyOutcomeCheck = Callable[[str, str], CheckAnswer | Awaitable[CheckAnswer]]
_F = TypeVar("_F", bound=AnyOutcomeCheck)


class SessionMessenger(Protocol):
    """The two calls the seed's example makes; `AsyncDexClient` has both (S8.3)."""

    async def get_agent_snapshot(self, session_id: str) -> AgentSnapshot: ...

    async def send_user_message(self, session_id: str, text: str) -> bool: ...


def _unknown_messages(messages: Iterable[Message]) -> list[Message]:
    return [m for m in messages if OUTCOME_UNKNOWN_TOOL_RESULT in (m.tool_output or "")]


def _user_text(messages: Iterable[Message]) -> str:
    return "\n".join(m.text or "" for m in messages if m.role == MessageRole.USER)


def check_answer(answer: object, *, key: str) -> CheckAnswer:
    """Text with something in it, or `CannotTellYet`; anything else is `InvalidCheckResult`."""
    if isinstance(answer, CannotTellYet):
        return answer
    if not isinstance(answer, str):
        raise InvalidCheckResult(
            f"the outcome check for {key} returned {type(answer).__name__}, not report text"
        )
    if not answer.strip():
        raise InvalidCheckResult(f"the outcome check for {key} returned empty text")
    return answer


# --- the seed's function -----------------------------------------------------------------------


async def report_unknown_outcomes(
    sessions: SessionMessenger, session_id: str, check: AnyOutcomeCheck
) -> list[str]:
    """Tell the session what really happened to each call with an unknown outcome (S8.1).

    The seed's semantics: read the history, rebuild each unknown call's key
    `session/turn/call`, skip calls a user message already names, ask `check`, and send
    `<answer> (tool call <key>)`. Returns the reports sent; running it again sends nothing new
    (S8.2). `check` may also be sync and may answer `CannotTellYet` (the call is skipped);
    an answer that is not text raises `InvalidCheckResult` after the earlier reports were sent,
    so rerun the whole function rather than retrying one send.
    """
    snapshot = await sessions.get_agent_snapshot(session_id)
    sent = _user_text(snapshot.messages)
    reports: list[str] = []
    for message in _unknown_messages(snapshot.messages):
        key = str(CallKey.of(session_id, message.turn_id, message.tool_call_id))
        if already_reported(key, sent):
            continue
        result = check(key, message.tool_arguments or "{}")
        answer = check_answer(await result if inspect.isawaitable(result) else result, key=key)
        if isinstance(answer, CannotTellYet):
            continue
        report = format_report(answer, key)
        await sessions.send_user_message(session_id, report)
        reports.append(report)
        sent = f"{sent}\n{report}"
    return reports


# --- the registry --------------------------------------------------------------------------------


class OutcomeChecks:
    """Outcome checks by tool name. One per tool; registering a second is a configuration error.

    The tool need not be registered yet (a deployment's `reconcile/` package may be imported
    before or after its `tasks/`); a check of a tool that never ends `outcome_unknown` is unused.
    """

    def __init__(self) -> None:
        self._checks: dict[str, AnyOutcomeCheck] = {}

    def register(self, tool_name: str, check: AnyOutcomeCheck) -> None:
        if not isinstance(tool_name, str) or not tool_name.strip():
            raise ConfigurationError(f"an outcome check needs a tool name, got {tool_name!r}")
        if not callable(check):
            raise ConfigurationError(
                f"the outcome check for {tool_name!r} is {type(check).__name__}, not callable"
            )
        if tool_name in self._checks:
            raise DuplicateOutcomeCheck(f"tool {tool_name!r} has an outcome check already")
        self._checks[tool_name] = check

    def decorator(self, tool_name: str) -> Callable[[_F], _F]:
        def register(check: _F) -> _F:
            self.register(tool_name, check)
            return check

        return register

    def get(self, tool_name: str) -> AnyOutcomeCheck | None:
        return self._checks.get(tool_name)

    @property
    def tool_names(self) -> frozenset[str]:
        return frozenset(self._checks)


def run_check(
    check: AnyOutcomeCheck, key: str, arguments: str, *, timeout: float = DEFAULT_CHECK_TIMEOUT
) -> CheckAnswer:
    """Call a sync or async check from sync code (a Celery task) and validate its answer."""
    result: Any = check(key, arguments)
    if inspect.isawaitable(result):
        result = run_sync(result, timeout=timeout)
    return check_answer(result, key=key)


# --- the beat job ---------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class ReconcileReport:
    """What one run did. The counts are the metric (S8.4); the Celery task returns `as_dict()`."""

    surfaced: int = 0
    reported: int = 0
    already_reported: int = 0
    cannot_tell_yet: int = 0
    errors: int = 0
    #: Open unknown calls of tools without a check, after this run: waiting for a person.
    open_without_check: int = 0
    surfaced_keys: tuple[str, ...] = field(default_factory=tuple)
    reported_keys: tuple[str, ...] = field(default_factory=tuple)
    error_keys: tuple[str, ...] = field(default_factory=tuple)

    def as_dict(self) -> dict[str, int]:
        return {k: v for k, v in asdict(self).items() if isinstance(v, int)}


class Verdict(StrEnum):
    """What one reconcile step did with one call."""

    REPORTED = "reported"
    ALREADY_REPORTED = "already_reported"
    CANNOT_TELL_YET = "cannot_tell_yet"
    NO_CHECK = "no_check"
    #: Not an open unknown outcome (any more): reported, closed by a person, or another status.
    NOT_OPEN = "not_open"


@dataclass(frozen=True, slots=True)
class SessionReconcile:
    """What one run for one session did, key by key (the web app's "reconcile now" button)."""

    session_id: str
    reported: tuple[str, ...] = ()
    already_reported: tuple[str, ...] = ()
    cannot_tell_yet: tuple[str, ...] = ()
    no_check: tuple[str, ...] = ()
    errors: tuple[tuple[str, str], ...] = field(default_factory=tuple)

    def summary(self) -> str:
        parts = [
            f"{len(self.reported)} reported",
            f"{len(self.already_reported)} already reported",
            f"{len(self.cannot_tell_yet)} cannot tell yet",
            f"{len(self.no_check)} without an outcome check (left for a person)",
            f"{len(self.errors)} failed",
        ]
        return f"session {self.session_id}: " + ", ".join(parts)


@translating_backend_errors
class Reconciler:
    """Reconciling `outcome_unknown` calls: the beat job, one session, one call (S8.4).

    Built once per process by the runtime. `reconcile_call` is the one per-call step; the beat
    job (`run_once`) and the web app's button (`reconcile_session`) both go through it, so the
    "reported once" guard, the check's bookkeeping and the surfaced/reported events are the same
    whichever started it.
    """

    def __init__(
        self,
        store: Store,
        events: AgentEvents,
        checks: OutcomeChecks,
        settings: Settings,
        settle: Callable[[ToolCallRecord, bool], None] | None = None,
    ) -> None:
        self.store = store
        self.events = events
        self.checks = checks
        self.settings = settings
        self.repo = UnknownOutcomes(store)
        #: Settles a reported call's held write budgets: (record, went through) (S13.1).
        self.settle = settle

    def surface(self, record: ToolCallRecord) -> bool:
        """Note a new `outcome_unknown` call once: a log line and an event (S8.4)."""
        if not self.repo.surface(record, now=self.store.clock()):
            return False
        has_check = self.checks.get(record.tool_name) is not None
        log.warning(
            "outcome_unknown call surfaced: %s (tool %s, %s): %s",
            record.key,
            record.tool_name,
            "checking it" if has_check else "no outcome check, left for a person",
            record.error or "",
        )
        self.events.publish(
            EventType.TOOL_CALL_OUTCOME_UNKNOWN_SURFACED,
            record.key,
            tool=record.tool_name,
            check="yes" if has_check else "no",
        )
        return True

    def reconcile_call(self, record: ToolCallRecord, user_text: str) -> tuple[Verdict, str]:
        """Ask the tool's check about one open unknown call and report its answer once (S8.1).

        `user_text` is the session's user messages seen so far (the "already reported" guard,
        S8.2). Returns the verdict and the report text sent ('' if none). A check that raises or
        answers nonsense is noted on the call and raised; the caller asks again next run.
        """
        key = record.key
        row = self.repo.get(key)
        if record.status is not CallStatus.OUTCOME_UNKNOWN or (
            row is not None and row.state != "open"
        ):
            return Verdict.NOT_OPEN, ""
        if row is None:
            self.surface(record)
        if already_reported(key, user_text):
            self.repo.mark_reported(key, now=self.store.clock())
            announce_repeat_evidence(self.store, self.events, key, RECONCILED)
            return Verdict.ALREADY_REPORTED, ""
        check = self.checks.get(record.tool_name)
        if check is None:
            return Verdict.NO_CHECK, ""
        answer, text = self._ask(check, key, record.arguments)
        if isinstance(answer, CannotTellYet):
            log.info("outcome check for %s cannot tell yet: %s", key, answer.reason)
            return Verdict.CANNOT_TELL_YET, ""
        verdict = None
        if isinstance(answer, WentThrough | DidNotRun):
            verdict = WENT_THROUGH if isinstance(answer, WentThrough) else DID_NOT_RUN
        if not self.repo.report(record, text, now=self.store.clock(), verdict=verdict):
            return Verdict.ALREADY_REPORTED, ""
        if verdict is not None and record.budgets and self.settle is not None:
            self.settle(record, verdict == WENT_THROUGH)
        log.info("reported the outcome of %s to session %s", key, record.session_id)
        self.events.publish(EventType.TOOL_CALL_OUTCOME_REPORTED, key, tool=record.tool_name)
        announce_repeat_evidence(self.store, self.events, key, RECONCILED)
        return Verdict.REPORTED, text

    def _ask(self, check: AnyOutcomeCheck, key: str, arguments: str) -> tuple[CheckAnswer, str]:
        """Run the check and note the attempt; (answer, report text or '')."""
        try:
            answer = run_check(check, key, arguments, timeout=self.settings.check_timeout)
            text = "" if isinstance(answer, CannotTellYet) else format_report(answer, key)
            if text:
                # The size limit of any user message.
                check_text(text, limit=self.settings.max_text_bytes)
        except Exception as e:
            self.repo.note_check(key, now=self.store.clock(), error=f"{type(e).__name__}: {e}")
            raise
        self.repo.note_check(key, now=self.store.clock(), error=None)
        return answer, text

    def run_once(
        self, *, checks: OutcomeChecks | None = None, limit: int | None = None
    ) -> ReconcileReport:
        """One run of the beat job. Safe to run twice at once (see `UnknownOutcomes`)."""
        run = (
            self
            if checks is None
            else Reconciler(self.store, self.events, checks, self.settings, self.settle)
        )
        limit = limit or self.settings.sweep_batch
        surfaced: list[str] = []
        failed: list[str] = []
        for key in run.repo.unsurfaced(limit=limit):
            try:
                record = run.store.get_call(key)
                if record is not None and run.surface(record):
                    surfaced.append(key)
            except Exception:
                failed.append(key)
                log.exception("could not surface %s; trying again next run", key)
        verdicts: dict[Verdict, list[str]] = {verdict: [] for verdict in Verdict}
        user_texts: dict[str, str] = {}
        for key in run.repo.open_keys(run.checks.tool_names, limit=limit):
            try:
                record = run.store.get_call(key)
                if record is None:
                    raise UnknownCall(f"no tool call {key!r}")
                sid = record.session_id
                if sid not in user_texts:
                    user_texts[sid] = run.repo.user_texts(sid)
                verdict, text = run.reconcile_call(record, user_texts[sid])
                user_texts[sid] += "\n" + text if text else ""
                verdicts[verdict].append(key)
            except InvalidCheckResult as e:
                failed.append(key)
                log.error("%s; trying again next run", e)
            except Exception:
                failed.append(key)
                log.exception("outcome check for %s failed; trying again next run", key)
        report = ReconcileReport(
            surfaced=len(surfaced),
            reported=len(verdicts[Verdict.REPORTED]),
            already_reported=len(verdicts[Verdict.ALREADY_REPORTED]),
            cannot_tell_yet=len(verdicts[Verdict.CANNOT_TELL_YET]),
            errors=len(failed),
            open_without_check=run.repo.count_open_without(run.checks.tool_names),
            surfaced_keys=tuple(surfaced),
            reported_keys=tuple(verdicts[Verdict.REPORTED]),
            error_keys=tuple(failed),
        )
        if report.surfaced or report.reported or report.errors:
            log.info("reconcile: %s", report.as_dict())
        return report

    def reconcile_session(self, session_id: str) -> SessionReconcile:
        """Ask the outcome check of each unreported `outcome_unknown` call of one session."""
        validate_id("session id", session_id)
        calls, history = self.store.snapshot(session_id)
        sent = _user_text(history)
        verdicts: dict[Verdict, list[str]] = {verdict: [] for verdict in Verdict}
        errors: list[tuple[str, str]] = []
        for record in calls:
            try:
                verdict, text = self.reconcile_call(record, sent)
            except Exception as e:
                errors.append((record.key, f"{type(e).__name__}: {e}"))
                log.warning("outcome check for %s failed: %s", record.key, e)
                continue
            sent += "\n" + text if text else ""
            verdicts[verdict].append(record.key)
        return SessionReconcile(
            session_id,
            tuple(verdicts[Verdict.REPORTED]),
            tuple(verdicts[Verdict.ALREADY_REPORTED]),
            tuple(verdicts[Verdict.CANNOT_TELL_YET]),
            tuple(verdicts[Verdict.NO_CHECK]),
            tuple(errors),
        )


class HasReconciler(Protocol):
    """Whatever holds this process's reconciler (a `Dex`); the engine never imports the façade."""

    @property
    def reconciler(self) -> Reconciler: ...


def reconcile_once(
    deployment: HasReconciler, *, checks: OutcomeChecks | None = None, limit: int | None = None
) -> ReconcileReport:
    """One run of the reconcile beat job (S8.4) of a deployment (`reconcile_once(dex)`)."""
    return deployment.reconciler.run_once(checks=checks, limit=limit)
