"""dex-celery: AI-agent tool calls on Celery and Redis with honest outcomes.

Reads and idempotent writes are retried; non-idempotent writes run at most once; every call ends
in exactly one record (`succeeded`, `failed`, `rejected`, `outcome_unknown`).
"""

from dex_celery.app import Dex, configure_celery
from dex_celery.client import AsyncDexClient, DexClient
from dex_celery.dispatch import CallRequest
from dex_celery.errors import (
    AlreadyDecided,
    ApprovalDeadlinePassed,
    ApprovalError,
    ArgumentsTooLarge,
    AttemptCancelled,
    CallTimeout,
    ConfigurationError,
    DexError,
    DuplicateTool,
    InvalidArguments,
    InvalidId,
    InvalidRequest,
    InvalidText,
    LedgerError,
    NotAwaitingApproval,
    PolicyError,
    PublishError,
    RetryableToolError,
    ToolError,
    UnknownCall,
    UnknownEffectClass,
    UnknownSession,
    UnknownTool,
)
from dex_celery.ids import CallKey
from dex_celery.outcomes import DID_NOT_RUN, OUTCOME_UNKNOWN_TOOL_RESULT, CallStatus
from dex_celery.policy import EffectClass, PolicySnapshot, ToolPolicy
from dex_celery.records import AgentSnapshot, Message, MessageRole, ToolCallRecord
from dex_celery.settings import Settings
from dex_celery.tools import ToolContext

__all__ = [
    "DID_NOT_RUN",
    "OUTCOME_UNKNOWN_TOOL_RESULT",
    "AgentSnapshot",
    "AlreadyDecided",
    "ApprovalDeadlinePassed",
    "ApprovalError",
    "ArgumentsTooLarge",
    "AsyncDexClient",
    "AttemptCancelled",
    "CallKey",
    "CallRequest",
    "CallStatus",
    "CallTimeout",
    "ConfigurationError",
    "Dex",
    "DexClient",
    "DexError",
    "DuplicateTool",
    "EffectClass",
    "InvalidArguments",
    "InvalidId",
    "InvalidRequest",
    "InvalidText",
    "LedgerError",
    "Message",
    "MessageRole",
    "NotAwaitingApproval",
    "PolicyError",
    "PolicySnapshot",
    "PublishError",
    "RetryableToolError",
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
]
