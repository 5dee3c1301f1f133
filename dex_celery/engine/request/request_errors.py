"""The errors of a request that failed after its calls were, or may have been, recorded (S11.2).

A request commits its calls in SQL first and only then opens them in the Redis ledger and
publishes them. A failure after the commit does not undo the call: the sweeper's orphan check
starts every pending call that has no ledger entry (docs/ledger.md), a write included. So the
error must not read as "nothing happened" (the caller would ask again under new ids and run the
write twice); it says the call is recorded, that it will run or be judged once the ledger is
back, and that asking again with the same ids follows that same call.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence

from dex_celery.backend_errors import first_line, translate
from dex_celery.errors import CallRecordedNotStarted, RecordingUnconfirmed
from dex_celery.model.outcomes import CallStatus
from dex_celery.model.records import ToolCallRecord
from dex_celery.settings import Settings

#: What every such error ends with: how to follow the call, and what never to do.
FOLLOW = (
    "Ask again with the same session, turn and tool-call ids to follow it: that returns this "
    "same call and never runs it twice. Do not ask under new ids: that is a second call, and "
    "a write would run twice."
)


def _calls(keys: Sequence[str]) -> str:
    shown = ", ".join(keys[:5]) + (f" and {len(keys) - 5} more" if len(keys) > 5 else "")
    return f"tool call {shown}" if len(keys) == 1 else f"tool calls {shown}"


def translate_backend_error(error: BaseException, settings: Settings) -> BaseException:
    """`error` as the backends' errors word it (password hidden), or itself."""
    translated = translate(error, redis_url=settings.redis_url, database_url=settings.database_url)
    return translated if translated is not None else error


def cause_text(error: BaseException, settings: Settings) -> str:
    """The failure in one line, as the backends' errors word it (password hidden)."""
    return first_line(translate_backend_error(error, settings)).rstrip(".")


def recorded_not_started(
    records: Sequence[ToolCallRecord],
    new: Collection[str],
    error: BaseException,
    settings: Settings,
) -> CallRecordedNotStarted:
    """The request's insert is committed, but opening or publishing its calls failed.

    `new`: the keys this request recorded (the others were recorded before and go on as they
    were; the same ids are the same call, S2.3)."""
    keys = tuple(r.key for r in records)
    fresh = [r for r in records if r.key in new] or list(records)
    named = [r.key for r in fresh]
    waiting = [r.key for r in fresh if r.status is CallStatus.AWAITING_APPROVAL]
    approval = f" ({', '.join(waiting)} waiting for approval, as recorded)" if waiting else ""
    before = [k for k in keys if k not in named]
    earlier = f" ({_calls(before)} recorded before, going on as recorded)" if before else ""
    is_are = "is" if len(named) == 1 else "are"
    message = (
        f"{_calls(named)} {is_are} recorded, but could not be started{approval}{earlier}: "
        f"{cause_text(error, settings)}. "
        f"{'It is' if len(named) == 1 else 'They are'} not lost: once Redis answers again, the "
        f"sweeper starts what was not started (a call waiting for approval is started once "
        f"approved), so it will run, or end with a record saying it did not run. {FOLLOW}"
    )
    return CallRecordedNotStarted(message, keys=keys, records=tuple(records))


def recording_unconfirmed(keys: Sequence[str], error: BaseException) -> RecordingUnconfirmed:
    """The connection broke during the insert's COMMIT: the calls may or may not be recorded."""
    message = (
        f"{_calls(keys)} may or may not be recorded: {first_line(error).rstrip('.')}. If "
        f"{'it is' if len(keys) == 1 else 'they are'}, the sweeper will start "
        f"{'it' if len(keys) == 1 else 'them'} once the database and Redis answer; asking again "
        f"records what is missing. {FOLLOW}"
    )
    return RecordingUnconfirmed(message, keys=tuple(keys))
