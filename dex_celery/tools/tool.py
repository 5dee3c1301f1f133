"""What a tool author writes against: the registered tool and the context each attempt gets."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

from pydantic import BaseModel

from dex_celery.errors import AttemptCancelled, UnknownTool
from dex_celery.model.ids import CallKey
from dex_celery.model.policy import EffectClass, ToolPolicy, declared_effect

#: The prefix of every tool's Celery task name: `dex.tool.<name>` (shown in Flower).
TASK_PREFIX = "dex.tool."

ToolFunction = Callable[..., Any]
#: `preview(**validated_arguments) -> str` (or an `async def`): what a call would do, in words.
PreviewFunction = Callable[..., Any]


@dataclass(frozen=True, slots=True)
class Tool:
    """A registered tool: its function, declared policy and framework metadata (S1.4)."""

    name: str
    function: ToolFunction
    policy: ToolPolicy
    annotations: Mapping[str, Any] = field(default_factory=lambda: MappingProxyType({}))
    description: str = ""
    #: The JSON Schema of the arguments object: derived from a Python tool's signature at
    #: registration, or given (a tool with no Python signature, e.g. an MCP server's tool).
    input_schema: Mapping[str, Any] | None = None
    #: The pydantic model of the signature (None for a schema-only tool); see `arguments.py`.
    arguments_model: type[BaseModel] | None = field(default=None, compare=False, repr=False)
    #: Asked at each request: a reason the call must wait for approval now whatever the policy
    #: says (an MCP tool whose definition changed since a person accepted it), or None.
    approval_gate: Callable[[], str | None] | None = field(default=None, compare=False, repr=False)
    #: Called on a worker with the call's validated arguments when the call starts waiting for
    #: approval; returns short text saying what the call would do (docs/guardrails.md,
    #: "Previews"). Read-only: it runs as a read, may run again, and is never fenced.
    preview: PreviewFunction | None = field(default=None, compare=False, repr=False)

    @property
    def task_name(self) -> str:
        return TASK_PREFIX + self.name

    @property
    def declared_effect(self) -> EffectClass | None:
        """The effect class the tool itself declares (policy, then metadata); None when only the
        session default would say (the worker then treats the call as a write)."""
        return declared_effect(self.policy, self.annotations)

    @property
    def effect_hint(self) -> str | None:
        """`declared_effect` as its string value (what a Celery message carries)."""
        effect = self.declared_effect
        return effect.value if effect is not None else None


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
        deadline: float | None = None,
    ) -> None:
        self.call = key
        self.attempt = attempt
        #: When this attempt reaches its start-to-close time limit (S3.5, S5.1), on the
        #: `time.monotonic()` clock of this process; None without a limit.
        self.deadline = deadline
        self._cancelled = threading.Event()
        self._beat = beat
        self._on_cancel: list[Callable[[], Any]] = []
        self._lock = threading.Lock()

    @property
    def idempotency_key(self) -> str:
        """`session/turn/call`, the same for every attempt: pass it to the service."""
        return self.call.key

    @property
    def session_id(self) -> str:
        """The session (agent conversation) the call belongs to."""
        return self.call.session_id

    def time_left(self) -> float | None:
        """Seconds until the attempt's start-to-close time limit (S5.1), never below 0; None
        without a limit. A tool waiting on another service can give up, and say what it knows,
        before the limit fences it."""
        if self.deadline is None:
            return None
        return max(0.0, self.deadline - time.monotonic())

    @property
    def cancelled(self) -> bool:
        """True once the system has fenced this attempt (timed out or presumed lost): stop."""
        return self._cancelled.is_set()

    def cancel(self) -> None:
        """Fence-side: tell the tool to stop; an async tool's coroutine is cancelled."""
        with self._lock:
            self._cancelled.set()
            callbacks, self._on_cancel = self._on_cancel, []
        for callback in callbacks:
            callback()

    def on_cancel(self, callback: Callable[[], Any]) -> None:
        """Run `callback` when the attempt is cancelled (at once if it already was)."""
        with self._lock:
            if not self._cancelled.is_set():
                self._on_cancel.append(callback)
                return
        callback()

    def heartbeat(self, *, raise_if_cancelled: bool = False) -> bool:
        """Renew this attempt's lease now (S3.4): True while the attempt is still ours.

        False (or `AttemptCancelled` with `raise_if_cancelled=True`) once the attempt was fenced
        (timed out, presumed lost) or its lease ran out before Redis could be reached: stop
        then. A Redis fault shorter than the lease (a reset or refused connection, a time-out, a
        failover) is never raised here: the renewal is tried again within the remaining lease,
        so this call may block for up to the lease while Redis is away.
        """
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
