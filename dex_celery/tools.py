"""What a tool author writes against: the registered tool and the context each attempt gets."""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

from dex_celery.errors import AttemptCancelled, UnknownTool
from dex_celery.ids import CallKey
from dex_celery.policy import ToolPolicy

#: The prefix of every tool's Celery task name: `dex.tool.<name>` (shown in Flower).
TASK_PREFIX = "dex.tool."

ToolFunction = Callable[..., Any]


@dataclass(frozen=True, slots=True)
class Tool:
    """A registered tool: its function, declared policy and framework metadata (S1.4)."""

    name: str
    function: ToolFunction
    policy: ToolPolicy
    annotations: Mapping[str, Any] = field(default_factory=lambda: MappingProxyType({}))
    description: str = ""
    #: JSON Schema of the arguments object, checked when a call is requested (S9.3); MCP tools
    #: carry their server's `inputSchema` here.
    input_schema: Mapping[str, Any] | None = None

    @property
    def task_name(self) -> str:
        return TASK_PREFIX + self.name


class ToolContext:
    """Handed to the tool as its first argument for every attempt.

    `idempotency_key` is the same for every attempt of one call (S2.1): pass it to every service
    the tool writes to; that is what makes a retry, or the double run of S5.1, harmless.
    """

    def __init__(
        self,
        key: CallKey,
        attempt: int,
        *,
        beat: Callable[[], bool] | None = None,
    ) -> None:
        self.call = key
        self.attempt = attempt
        self._cancelled = threading.Event()
        self._beat = beat

    @property
    def idempotency_key(self) -> str:
        """`session/turn/call`, the same for every attempt: pass it to the service."""
        return self.call.key

    @property
    def session_id(self) -> str:
        """The session (agent conversation) the call belongs to."""
        return self.call.session_id

    @property
    def cancelled(self) -> bool:
        """True once the system has fenced this attempt (timed out or presumed lost): stop."""
        return self._cancelled.is_set()

    def cancel(self) -> None:
        """Set by the system when the attempt is fenced; the tool should stop."""
        self._cancelled.set()

    def heartbeat(self, *, raise_if_cancelled: bool = False) -> bool:
        """Renew this attempt's lease now; returns False (or raises) if it was fenced (S3.4)."""
        alive = self._beat() if self._beat is not None else not self.cancelled
        if not alive:
            self.cancel()
            if raise_if_cancelled:
                raise AttemptCancelled(f"attempt {self.attempt} of {self.call} was cancelled")
        return alive


def find_tool(tools: Mapping[str, Tool], name: str) -> Tool:
    """The registered tool `name`; `UnknownTool` (naming the known ones) if there is none."""
    try:
        return tools[name]
    except KeyError:
        known = ", ".join(sorted(tools)) or "none"
        raise UnknownTool(f"no tool named {name!r} is registered (known: {known})") from None
