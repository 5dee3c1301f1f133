"""The phases of an attempt, and the hooks that hang on their boundaries.

`Worker.run` is a plain sequence: admit the delivery (claim it), run the tool, finish in the
ledger, act on the step. What watches an attempt without deciding it (tracing spans, the crash
tests' pause points, the Flower REFUSED event) is a hook on the phases' boundaries
(`engine/attempt/hooks.py` lists them, in order), not code woven through the sequence; a new
concern of that kind is one more hook there (docs/architecture.md, "An attempt's phases").

The phases nest; `ATTEMPT` holds the others:

- `ATTEMPT`: from the delivery to the step acted on (its result returned or raised).
- `ADMIT`: the delivery admitted, or refused without running any tool code: the shutdown gate,
  the ledger's claim, the replica check, the write fence (or an approval's binding).
- `CLAIM`: inside `ADMIT`, the ledger's claim itself (a retry's backoff waited out first).
- `RUN`: the tool's code, under the heartbeat pump (entered once its lease is renewed).
- `FINISH`: the ledger told how the attempt ended, and its step decided.

A hook sees an immutable `AttemptContext` at each boundary: who the attempt is and what is
known so far (the session, the claim's effect class, how the tool's run ended, the step, the
outcome). The worker makes a new context as it learns more (`AttemptPhases`); a hook keeps what
it opened in a phase (a span) in the token its `enter` returns, handed back to its `exit`.
Hooks are entered in list order and exited in the reverse order, like nested `with` blocks.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from enum import StrEnum
from types import TracebackType
from typing import Protocol

from dex_celery.ledger.ledger import Cause, Step, StepKind


class Phase(StrEnum):
    ATTEMPT = "attempt"
    ADMIT = "admit"
    CLAIM = "claim"
    RUN = "run"
    FINISH = "finish"


@dataclass(frozen=True, slots=True)
class AttemptContext:
    """One attempt as its hooks see it at a phase boundary; None: not known (yet)."""

    key: str
    attempt: int
    tool: str
    #: The call's session, once its key parsed.
    session: str | None = None
    #: The claim's effect class, once the ledger granted the claim.
    effect: str | None = None
    #: How the tool's run ended; None while it has not run (or will not: the claim is short of
    #: its replicas).
    cause: Cause | None = None
    #: The ledger's step, once the attempt finished there.
    step: StepKind | None = None
    #: How the attempt ended so far, as a trace shows it: a record's status, a step, or why the
    #: delivery was not run (`handed_back`, `frozen`, `claim_refused:<reason>`, ...).
    outcome: str | None = None
    #: Why the claim was refused, when the delivery is shown REFUSED in Flower.
    refused: str | None = None


class PhaseHook(Protocol):
    """Something that watches attempts at their phases' boundaries.

    `phases`: the phases it hangs on (it is not called for the others). `enter` returns a token
    (anything, None included) that `exit` gets back; `error` is the exception leaving the
    phase, if one does. A hook observes: it must not decide the attempt.
    """

    @property
    def phases(self) -> frozenset[Phase]: ...

    def enter(self, phase: Phase, ctx: AttemptContext) -> object: ...

    def exit(
        self, phase: Phase, ctx: AttemptContext, token: object, error: BaseException | None
    ) -> None: ...


class Phases:
    """The hooks of this process's attempts, in order; one per worker (`Worker.phases`)."""

    def __init__(self, hooks: Iterable[PhaseHook]) -> None:
        ordered = tuple(hooks)
        #: Per phase, the hooks that hang on it, in order: a phase costs only its own hooks.
        self._by_phase = {p: tuple(h for h in ordered if p in h.phases) for p in Phase}

    def start(self, key: str, attempt: int, tool: str) -> AttemptPhases:
        """The phases of one attempt, its context holding only who it is."""
        return AttemptPhases(self._by_phase, AttemptContext(key, attempt, tool))


class AttemptPhases:
    """One attempt's way through its phases: `with phases.phase(Phase.RUN): ...` calls the
    hooks around the block; the worker records what it learns with the other methods, each a
    new `AttemptContext` (the hooks see the one current at each boundary)."""

    __slots__ = ("_by_phase", "ctx")

    def __init__(self, by_phase: dict[Phase, tuple[PhaseHook, ...]], ctx: AttemptContext) -> None:
        self._by_phase = by_phase
        self.ctx = ctx

    def phase(self, phase: Phase) -> _Boundary:
        return _Boundary(self, phase, self._by_phase[phase])

    def parsed(self, session: str) -> None:
        c = self.ctx
        self.ctx = AttemptContext(
            c.key, c.attempt, c.tool, session, c.effect, c.cause, c.step, c.outcome, c.refused
        )

    def claimed(self, effect: str) -> None:
        c = self.ctx
        self.ctx = AttemptContext(
            c.key, c.attempt, c.tool, c.session, effect, c.cause, c.step, c.outcome, c.refused
        )

    def ran(self, cause: Cause) -> None:
        c = self.ctx
        self.ctx = AttemptContext(
            c.key, c.attempt, c.tool, c.session, c.effect, cause, c.step, c.outcome, c.refused
        )

    def finished(self, step: Step) -> None:
        """The ledger's step; a finished call's outcome is its status, any other its kind."""
        c = self.ctx
        outcome = step.status if step.kind is StepKind.FINISHED else step.kind
        self.ctx = AttemptContext(
            c.key, c.attempt, c.tool, c.session, c.effect, c.cause, step.kind, outcome, c.refused
        )

    def not_run(self, outcome: str, refused: str | None = None) -> None:
        """The delivery ends without running the tool: `outcome` for the trace, and `refused`,
        the claim's refusal to show in Flower (None: not shown as refused, e.g. handed back)."""
        c = self.ctx
        self.ctx = AttemptContext(
            c.key, c.attempt, c.tool, c.session, c.effect, c.cause, c.step, outcome, refused
        )


class _Boundary:
    """The hooks around one phase of one attempt (a `with` block)."""

    __slots__ = ("_hooks", "_phase", "_phases", "_tokens")

    def __init__(self, phases: AttemptPhases, phase: Phase, hooks: tuple[PhaseHook, ...]) -> None:
        self._phases = phases
        self._phase = phase
        self._hooks = hooks
        self._tokens: list[object] = []

    def __enter__(self) -> AttemptPhases:
        ctx = self._phases.ctx
        tokens = self._tokens
        try:
            for hook in self._hooks:
                tokens.append(hook.enter(self._phase, ctx))
        except BaseException as e:  # the hooks entered so far are exited, as `with` would
            self._exit(e)
            raise
        return self._phases

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self._exit(error)

    def _exit(self, error: BaseException | None) -> None:
        ctx = self._phases.ctx
        phase = self._phase
        tokens = self._tokens
        hooks = self._hooks
        for i in range(len(tokens) - 1, -1, -1):
            hooks[i].exit(phase, ctx, tokens[i], error)
