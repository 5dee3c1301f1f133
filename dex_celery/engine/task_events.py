"""Flower tells the truth: a tool attempt's Celery state matches its call's record.

Flower knows a task only through Celery's task events, so the attempt's task ends the way its
record does:

| record / attempt                          | Celery state in Flower | shown                          |
|-------------------------------------------|------------------------|--------------------------------|
| `succeeded`                               | SUCCESS                | result: the record's summary   |
| `failed`, `outcome_unknown` (worker)      | FAILURE                | exception: the outcome's text  |
| attempt ended, call retried               | RETRY                  | why, and that another follows  |
| delivery refused by the claim (stale)     | REFUSED                | why the claim was refused      |
| decided outside a worker (lost, expired,  | FAILURE / RETRY        | the outcome's text, sent by    |
| timed out: sweeper, dead pool process)    |                        | the process that decided it    |

The last row matters for calls that never reached a worker: Flower saw only `task-sent` and
would show them PENDING for ever; the sweeper that ends them sends the task's failure event.
Celery's event state keeps the strongest state (SUCCESS, then FAILURE), so a late or stale
event never overrides a recorded success.
"""

from __future__ import annotations

import logging
import socket
import threading
from typing import Any

from celery import Celery, current_task
from celery.exceptions import Retry

from dex_celery.errors import DexError
from dex_celery.ledger.ledger import Step, StepKind
from dex_celery.model.ids import CallKey
from dex_celery.model.outcomes import CallStatus
from dex_celery.settings import Settings
from dex_celery.store.values import Outcome

log = logging.getLogger("dex_celery.engine.task_events")

#: Longest text put into a task event (Flower keeps every task's fields in memory).
MAX_EVENT_TEXT = 1000
#: Seconds a worker's parent waits before re-announcing an attempt whose pool process died: its
#: own `task-failed` event (an opaque `ExceptionWithTraceback()`) is sent right after the
#: `task_failure` signal that decided the outcome, and the later FAILURE event is the one kept.
WORKER_LOST_ANNOUNCE_DELAY = 1.0
#: The custom Celery event, and so the Flower state, of a delivery its claim refused.
REFUSED_EVENT = "task-refused"


class AttemptFailed(DexError):
    """Raised by a tool task so Celery (and Flower) record FAILURE with the outcome's text.

    Pickles by its one message argument, so it crosses the prefork pipe intact.
    """


def _short(text: str) -> str:
    return text if len(text) <= MAX_EVENT_TEXT else text[: MAX_EVENT_TEXT - 1] + "…"


def summary(outcome: Outcome) -> str:
    """What the task's result or failure says: the status, then the result or the error."""
    if outcome.status is CallStatus.SUCCEEDED:
        return _short(f"succeeded: {outcome.result or ''}")
    return _short(f"{outcome.status.value}: {outcome.error}")


def task_result(outcome: Outcome) -> str:
    """The tool task's return value for a finished call, or `AttemptFailed` for one that ended
    any other way."""
    if outcome.status is CallStatus.SUCCEEDED:
        return summary(outcome)
    raise AttemptFailed(summary(outcome))


def retry(attempt: int, detail: str) -> Retry:
    """The exception that makes this attempt RETRY in Flower; the ledger has already queued
    the next attempt (a new task), so Celery itself publishes nothing."""
    text = _short(
        f"attempt {attempt} ended ({detail or 'retryable'}); attempt {attempt + 1} follows"
    )
    return Retry(text, exc=AttemptFailed(text))


def refuse_delivery(settings: Settings, key: str, attempt: int, reason: str) -> None:
    """Mark the delivery REFUSED in Flower: its claim was refused, so no tool code ran."""
    task = current_task
    if not settings.task_events or task is None or not getattr(task, "request", None):
        return
    text = _short(f"attempt {attempt} of {key} not run: its claim was refused ({reason})")
    try:
        task.send_event(REFUSED_EVENT, exception=text, retry=False)
    except Exception:  # monitoring must never break the refusal itself
        log.warning("could not send the %s event for %s", REFUSED_EVENT, key, exc_info=True)


def announce_decided(
    celery: Celery, settings: Settings, key: str, attempt: int, outcome: Outcome | None
) -> None:
    """Send the attempt's final task event from a process that is not its worker (the sweeper,
    a worker's parent after its pool child died). `outcome` None: the call goes on (retry)."""
    if not settings.task_events or attempt < 1:
        return
    task_id = CallKey.parse(key).task_id(attempt)
    if outcome is None:
        fields: dict[str, Any] = {"exception": _short(f"attempt {attempt} ended; retried")}
        event = "task-retried"
    elif outcome.status is CallStatus.SUCCEEDED:
        fields = {"result": summary(outcome), "runtime": 0.0}
        event = "task-succeeded"
    else:
        fields = {"exception": f"AttemptFailed({summary(outcome)!r})", "traceback": ""}
        event = "task-failed"
    try:
        # The app's producer pool: a sweep ending many calls reuses one connection.
        with celery.events.default_dispatcher(
            hostname=f"dex-sweeper@{socket.gethostname()}"
        ) as dispatcher:
            dispatcher.send(event, uuid=task_id, **fields)
    except Exception:  # Flower's view is best effort; the record is what counts
        log.warning("could not send the %s event for %s", event, task_id, exc_info=True)


def announce_after_worker_lost(
    celery: Celery, settings: Settings, key: str, attempt: int, step: Step, outcome: Outcome | None
) -> None:
    """`announce_decided` for a dead pool process, sent once Celery's own event has gone."""
    timer = threading.Timer(
        WORKER_LOST_ANNOUNCE_DELAY,
        announce_decided,
        args=(celery, settings, key, attempt, outcome if step.kind is StepKind.FINISHED else None),
    )
    timer.daemon = True
    timer.start()
