"""dex-celery: AI-agent tool calls on Celery and Redis with honest outcomes.

Reads and idempotent writes are retried; non-idempotent writes run at most once; every call ends
in exactly one record (`succeeded`, `failed`, `rejected`, `outcome_unknown`).
"""

from dex_celery.agent_loop import ModelToolCall, run_tool_calls, run_tool_calls_async
from dex_celery.app import Dex, configure_celery
from dex_celery.approvals import Approvals, PendingApproval
from dex_celery.client import AsyncDexClient, DexClient
from dex_celery.dispatch import CallRequest
from dex_celery.errors import (
    AlreadyDecided,
    ApprovalDeadlinePassed,
    ApprovalError,
    ArgumentsTooLarge,
    AttemptCancelled,
    CallConflict,
    CallTimeout,
    ConfigurationError,
    DexError,
    DuplicateOutcomeCheck,
    DuplicateTool,
    InvalidArguments,
    InvalidCheckResult,
    InvalidDecision,
    InvalidEventPosition,
    InvalidId,
    InvalidRequest,
    InvalidText,
    InvalidToolArguments,
    InvalidToolSignature,
    LedgerError,
    NotAwaitingApproval,
    OutcomeCheckError,
    PolicyError,
    PublishError,
    RetryableToolError,
    SecretKeyMissing,
    ToolError,
    UnknownCall,
    UnknownEffectClass,
    UnknownSession,
    UnknownTool,
)
from dex_celery.events import AgentEvent, AgentEvents, EventType
from dex_celery.ids import CallKey
from dex_celery.outcomes import DID_NOT_RUN, OUTCOME_UNKNOWN_TOOL_RESULT, CallStatus
from dex_celery.policy import EffectClass, PolicySnapshot, ToolPolicy
from dex_celery.reconcile import (
    CannotTellYet,
    OutcomeCheck,
    OutcomeChecks,
    ReconcileReport,
    SessionMessenger,
    reconcile_once,
    report_unknown_outcomes,
)
from dex_celery.records import AgentSnapshot, Message, MessageRole, ToolCallRecord
from dex_celery.settings import Settings
from dex_celery.tools import ToolContext

__all__ = [
    "DID_NOT_RUN",
    "OUTCOME_UNKNOWN_TOOL_RESULT",
    "AgentEvent",
    "AgentEvents",
    "AgentSnapshot",
    "AlreadyDecided",
    "ApprovalDeadlinePassed",
    "ApprovalError",
    "Approvals",
    "ArgumentsTooLarge",
    "AsyncDexClient",
    "AttemptCancelled",
    "CallConflict",
    "CallKey",
    "CallRequest",
    "CallStatus",
    "CallTimeout",
    "CannotTellYet",
    "ConfigurationError",
    "Dex",
    "DexClient",
    "DexError",
    "DuplicateOutcomeCheck",
    "DuplicateTool",
    "EffectClass",
    "EventType",
    "InvalidArguments",
    "InvalidCheckResult",
    "InvalidDecision",
    "InvalidEventPosition",
    "InvalidId",
    "InvalidRequest",
    "InvalidText",
    "InvalidToolArguments",
    "InvalidToolSignature",
    "LedgerError",
    "Message",
    "MessageRole",
    "ModelToolCall",
    "NotAwaitingApproval",
    "OutcomeCheck",
    "OutcomeCheckError",
    "OutcomeChecks",
    "PendingApproval",
    "PolicyError",
    "PolicySnapshot",
    "PublishError",
    "ReconcileReport",
    "RetryableToolError",
    "SecretKeyMissing",
    "SessionMessenger",
    "Settings",
    "ToolCallRecord",
    "ToolContext",
    "ToolError",
    "ToolPolicy",
    "UnknownCall",
    "UnknownEffectClass",
    "UnknownSession",
    "UnknownTool",
    "configure_celery",
    "reconcile_once",
    "report_unknown_outcomes",
    "run_tool_calls",
    "run_tool_calls_async",
]
