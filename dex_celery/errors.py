"""The one exception tree of dex-celery.

Every error the library raises on purpose is a `DexError`. Errors about what a caller passed in
are also `ValueError`s (or `LookupError`s for unknown names), so code written against the
standard hierarchy keeps working. Retry behaviour travels as attributes (`retryable`) rather
than as a parallel hierarchy, the way Temporal's `ApplicationError(non_retryable=...)` does.
"""

from __future__ import annotations

from typing import Any


class DexError(Exception):
    """Base of every error dex-celery raises on purpose."""

    #: The redis-py, Kombu or SQLAlchemy error behind this one, kept here rather than chained
    #: (`dex_celery.backend_errors.unchained`): its message is in this error's already.
    cause: BaseException | None = None


# --- configuration -------------------------------------------------------------------------


class ConfigurationError(DexError):
    """The deployment or a tool registration is wrong; raised at start-up, not per call."""


class PolicyError(ConfigurationError, ValueError):
    """A `ToolPolicy` contradicts the effect class it declares (S1.6)."""


class UnknownEffectClass(PolicyError):
    """An effect class string that is not one of the four of S1.2."""


class DuplicateTool(ConfigurationError):
    """Two tools registered under one name on the same app."""


class InvalidToolSignature(ConfigurationError):
    """A tool whose arguments cannot be described or checked: positional-only parameters, no
    context parameter, a type without a JSON Schema, an invalid `input_schema`, or
    `secret_arguments` naming a parameter the tool does not have."""


class SealError(ConfigurationError):
    """A sealed secret this process's `secret_key` cannot open (another key, or tampered)."""


# --- bad input of one request (S9.3) -------------------------------------------------------


class InvalidRequest(DexError, ValueError):
    """A request was refused before anything was recorded (S2.2, S9.3)."""


class InvalidId(InvalidRequest):
    """A session, turn or tool-call id that would make the idempotency key ambiguous (S2.2)."""


class InvalidArguments(InvalidRequest):
    """Tool arguments that are not a JSON object, or that exceed the size limit."""


class ArgumentsTooLarge(InvalidArguments):
    """Tool arguments larger than `Settings.max_argument_bytes`."""


class InvalidToolArguments(InvalidArguments):
    """Arguments that do not fit the tool's signature or input schema: missing, unexpected or
    of the wrong type. Refused at request time, before anyone is asked to approve the call."""


class CallConflict(InvalidRequest):
    """The same session, turn and tool-call ids were requested before for another tool or with
    other arguments. Same ids, same tool, same arguments is the same call (S2.3); anything else
    is a mistake the caller must see, not a silent answer about a different call."""


class UnknownDefinitionFormat(InvalidRequest):
    """`tool_definitions(format=...)` with a format other than openai, anthropic or mcp."""


class SecretKeyMissing(ConfigurationError):
    """A call with secret arguments was requested, but no `secret_key` is set to seal them."""


class InvalidText(InvalidRequest):
    """A message text that is empty, not text, or over the size limit."""


class UnknownTool(DexError, LookupError):
    """No tool is registered under the requested name."""


class McpServerUnavailable(UnknownTool):
    """A request named a tool that may be an MCP server's, and that server's tool list has never
    been fetched because the server could not be reached (`server` names it). Not the plain
    unknown-tool answer: ask again once the server is up (`dex-celery mcp-servers refresh`)."""

    def __init__(self, message: str, server: str) -> None:
        super().__init__(message)
        self.server = server


class UnknownSession(DexError, LookupError):
    """No session with this id exists."""


class UnknownCall(DexError, LookupError):
    """No tool call with this idempotency key exists."""


# --- approvals (S6.3) ----------------------------------------------------------------------


class ApprovalError(DexError):
    """A decision on a call that cannot take it; the decision was not recorded.

    `key` names the call and `status` is the status it was found in, so a caller can tell the
    cases apart without parsing the message.
    """

    def __init__(self, message: str, *, key: str | None = None, status: str | None = None) -> None:
        super().__init__(message)
        self.key = key
        self.status = status


class NotAwaitingApproval(ApprovalError):
    """The call is not waiting for a decision (never needed one, or was decided already)."""


class AlreadyDecided(NotAwaitingApproval):
    """Someone decided this call before; the first decision stands.

    `decision` ("approved" or "rejected"), `decided_by` and `decided_at` say which decision won.
    """

    def __init__(
        self,
        message: str,
        *,
        key: str | None = None,
        status: str | None = None,
        decision: str | None = None,
        decided_by: str | None = None,
        decided_at: float | None = None,
    ) -> None:
        super().__init__(message, key=key, status=status)
        self.decision = decision
        self.decided_by = decided_by
        self.decided_at = decided_at


class ApprovalDeadlinePassed(ApprovalError):
    """The approval deadline passed before the decision arrived; the decision was not recorded
    and the call is rejected (by this very call, if nothing had ended it yet)."""


class InvalidDecision(InvalidRequest):
    """A decision without a usable approver name, or with an oversized note or reason."""


class InvalidEdit(InvalidDecision):
    """An approver's edit of a call's arguments that the tool's schema (or the argument rules
    of S9.3) refuses; nothing was stored and the call still waits (S13.3)."""


# --- the write freeze (S13.2) --------------------------------------------------------------


class InvalidFreeze(InvalidRequest):
    """A freeze or thaw without a reason or operator name, or naming a tool the app lacks;
    nothing was written."""


class FreezeNotInLedger(DexError):
    """A freeze or thaw is recorded in SQL, but Redis could not be told yet; the sweeper makes
    the ledger agree with SQL at its next sweep."""


# --- infrastructure ------------------------------------------------------------------------


class LedgerError(DexError):
    """The Redis ledger answered something the state machine does not allow."""


class BackendUnavailable(DexError):
    """Redis or the database could not be reached or used.

    Raised in place of redis-py and SQLAlchemy errors (`dex_celery.backend_errors`), so callers
    catch one tree; the original error is its `cause` (not chained). This error alone does not say that
    nothing changed: a call whose earlier steps were committed before the failure says so with
    its own error instead (a request whose calls were recorded raises `RequestInFlight`).
    """


class RedisUnavailable(BackendUnavailable):
    """Redis (the ledger, the events stream, by default the broker) did not answer."""


class DatabaseUnavailable(BackendUnavailable):
    """The database did not answer, or refused the connection."""


class ArchiveError(DexError):
    """The archive of a prune cannot be written; nothing of the batch was deleted."""


class CommitUnconfirmed(DatabaseUnavailable):
    """The connection to the database broke while a transaction was being committed, so
    whether it was applied is unknown until the database answers again. Raised by the store
    where that difference matters (a request's insert, a write's claim), never for a failure
    before the commit was sent: that one provably changed nothing."""


class SchemaMissing(DatabaseUnavailable):
    """The database answers but has no dex-celery schema (run `dex-celery db upgrade`)."""


class SchemaOutdated(DatabaseUnavailable):
    """The database answers, but its schema is at an older revision than this code needs (run
    `dex-celery db upgrade`): a worker or beat refuses to start on it (docs/deploy.md)."""


class NotAlive(DexError):
    """A liveness probe's verdict: the worker's main loop, or beat's sweeper, stopped moving
    (`dex-celery probe live`, docs/operations.md)."""


# --- a request that raised after its calls were, or may have been, recorded (S11.2) ---------


class RequestInFlight(DexError):
    """`request_call` / `request_calls` raised after its calls were, or may have been, recorded.

    Such a call is not lost and not refused: once Redis and the database answer again, the
    sweeper starts it (or, for an attempt that never reached a worker, ends it with a record
    saying so), as it does for any call recorded but not started. Follow it by asking again with
    the same session, turn and tool-call ids: that returns this same call (S2.3) and never runs
    it twice. Never ask under new ids: that is a second call, and a write would run twice.

    `keys` are the idempotency keys of the calls concerned, so a caller can follow them with
    `get_call` or `wait` once the backends answer.
    """

    def __init__(self, message: str, *, keys: tuple[str, ...] = ()) -> None:
        super().__init__(message)
        self.keys = keys


class CallRecordedNotStarted(RequestInFlight):
    """The calls are recorded (their insert was committed) but were not all started: Redis
    refused or did not answer the ledger open or the publish (out of memory, gone). They will
    run, or be judged, once the ledger is back; `records` are the calls as recorded
    (`ToolCallRecord`s; typed loosely here because the exception tree imports nothing of the
    package)."""

    def __init__(
        self, message: str, *, keys: tuple[str, ...] = (), records: tuple[Any, ...] = ()
    ) -> None:
        super().__init__(message, keys=keys)
        self.records = records


class RecordingUnconfirmed(RequestInFlight):
    """The connection to the database broke while the request's insert was being committed:
    the calls may or may not be recorded. If they are, they run as recorded; asking again with
    the same ids finds out, and records them now if they were not."""


class AppNotFound(ConfigurationError):
    """`-A/--app` (or `$DEX_APP`) is missing, cannot be imported, or names no Dex."""


class PublishError(DexError):
    """The broker refused the attempt's message after every publish retry."""


class CallTimeout(DexError, TimeoutError):
    """A wait for calls to end ran out before they all ended."""


# --- events and reconciliation (S7.3, S8) ---------------------------------------------------


class InvalidEventPosition(InvalidRequest):
    """A position in the events stream that is not `0`, `$` or a stream id `<ms>-<seq>`."""


class DuplicateOutcomeCheck(ConfigurationError):
    """Two outcome checks registered for one tool; the second would silently win."""


class OutcomeCheckError(DexError):
    """An outcome check could not give a usable answer; the call stays open for the next run."""


class InvalidCheckResult(OutcomeCheckError):
    """An outcome check returned something other than report text or `CannotTellYet`."""


# --- raised by tools -----------------------------------------------------------------------


class ToolError(DexError):
    """A failure the tool reports on purpose; its message is what the model will read.

    `retryable=True` asks for another attempt, which only `read` and `idempotent_write` tools
    get (S3.1); for other classes the call ends `failed` with this message.
    """

    def __init__(self, message: str, *, retryable: bool = False) -> None:
        super().__init__(message)
        self.message = message
        self.retryable = retryable


class RetryableToolError(ToolError):
    """A transient failure: try again after backoff if the effect class allows it."""

    def __init__(self, message: str) -> None:
        super().__init__(message, retryable=True)


class ToolLost(ToolError):
    """The tool may have taken effect, but its answer was lost (a service that dropped the
    connection after the request was sent, an MCP server that died mid-call).

    The attempt ends as lost, exactly like a worker that stopped after its claim (S4.3): `read`
    and `idempotent_write` calls are retried, and when attempts are used up a read is `failed`
    and any other call `outcome_unknown`.
    """

    def __init__(self, message: str) -> None:
        super().__init__(message, retryable=False)


class AttemptCancelled(DexError):
    """Raised by `ToolContext.heartbeat(raise_if_cancelled=True)` once the attempt is fenced."""


class LedgerMismatch(ConfigurationError):
    """This process's Redis is not the ledger the database belongs to (one database, one
    ledger): acting on the database's calls from here would misjudge them as lost."""


class RebindNotConfirmed(ConfigurationError):
    """`dex-celery db rebind-ledger` without `--yes`: a rebind is the operator's word that the
    old ledger is gone for good, so it is never assumed."""


class AuditKeyError(ConfigurationError):
    """The audit log's signing or public key is missing, unreadable or not an Ed25519 key
    (docs/audit.md, "The key")."""


class AuditFileError(InvalidRequest):
    """An audit export given to `audit verify --file` is not one (docs/audit.md)."""
