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
- `RUN`: the tool's code, under the heartbeat pump (entered once the pump renews its lease).
- `FINISH`: the ledger told how the attempt ended, and its step decided.

A hook sees an immutable `AttemptContext` at each boundary: who the attempt is and what is
known so far (the session, the claim's effect class, how the tool's run ended, the step, the
outcome). `AttemptPhases` makes a new one once the worker learns more; a hook keeps what
it opened in a phase (a span) in the token its `enter` returns, handed back to its `exit`.
Hooks are entered in list order and exited in the reverse order, like nested `with` blocks.
"""

from __future__ import annotations

from collections.abc import Iterable
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass
from enum import StrEnum
from types import TracebackType
from typing import NamedTuple, Protocol

from dex_celery.ledger.ledger import Cause, Step, StepKind


class Phase(StrEnum):
    ATTEMPT = "attempt"
    ADMIT = "admit"
    CLAIM = "claim"
    RUN = "run"
    FINISH = "finish"


class AttemptContext(NamedTuple):
    """One attempt as its hooks see it at a phase boundary; None: not known (yet).

    Immutable like a frozen dataclass, but a tuple: made up to three times per attempt on the
    hot path, and a tuple is made in about half the time (measured: 1.5 against 2.4 us).
    """

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

    `enters` and `exits`: the phases whose beginning and end it hangs on (it is not called at
    the others' boundaries). `watching`: asked once per attempt, as it starts; False leaves the
    hook out of that attempt (tracing while no tracer provider is installed). `enter` returns a
    token (anything, None included) that `exit` of the same phase gets back (None if the hook
    does not enter that phase); `error` is the exception leaving the phase, if one does. A hook
    observes: it must not decide the attempt.
    """

    @property
    def enters(self) -> frozenset[Phase]: ...

    @property
    def exits(self) -> frozenset[Phase]: ...

    def watching(self) -> bool: ...

    def enter(self, phase: Phase, ctx: AttemptContext) -> object: ...

    def exit(
        self, phase: Phase, ctx: AttemptContext, token: object, error: BaseException | None
    ) -> None: ...


@dataclass(frozen=True, slots=True)
class _Plan:
    """One phase's hooks among those watching an attempt: entered in order, exited in reverse
    (each with its place in `entering`, for its token; -1: it did not enter)."""

    entering: tuple[PhaseHook, ...]
    exiting: tuple[tuple[PhaseHook, int], ...]


def _plans(hooks: tuple[PhaseHook, ...]) -> dict[Phase, _Plan | None]:
    """Per phase, its plan; None for a phase no hook hangs on (it then costs nothing)."""
    plans: dict[Phase, _Plan | None] = {}
    for phase in Phase:
        entering = tuple(h for h in hooks if phase in h.enters)
        exiting = tuple(
            (h, entering.index(h) if h in entering else -1)
            for h in reversed(hooks)
            if phase in h.exits
        )
        plans[phase] = _Plan(entering, exiting) if entering or exiting else None
    return plans


class Phases:
    """The hooks of this process's attempts, in order; one per worker (`Worker.phases`)."""

    def __init__(self, hooks: Iterable[PhaseHook]) -> None:
        self._hooks = tuple(hooks)
        #: The phases' plans per set of watching hooks (few: a hook is on or off), made once.
        self._plans: dict[tuple[bool, ...], dict[Phase, _Plan | None]] = {}

    def start(self, key: str, attempt: int, tool: str) -> AttemptPhases:
        """The phases of one attempt, its context holding only who it is."""
        watching = tuple([h.watching() for h in self._hooks])
        plans = self._plans.get(watching)
        if plans is None:
            on = tuple(h for h, w in zip(self._hooks, watching, strict=True) if w)
            plans = self._plans[watching] = _plans(on)
        return AttemptPhases(plans, key, attempt, tool)


class AttemptPhases:
    """One attempt's way through its phases: `with phases.phase(Phase.RUN): ...` calls the
    hooks around the block; the worker records what it learns with the other methods. The
    hooks see an `AttemptContext` made of what was known at their boundary (made only when a
    hook is there to see it, and again only once something new is known)."""

    __slots__ = (
        "_cause",
        "_ctx",
        "_effect",
        "_outcome",
        "_plans",
        "_refused",
        "_session",
        "_step",
        "attempt",
        "key",
        "tool",
    )

    def __init__(self, plans: dict[Phase, _Plan | None], key: str, attempt: int, tool: str) -> None:
        self._plans = plans
        self.key = key
        self.attempt = attempt
        self.tool = tool
        self._session: str | None = None
        self._effect: str | None = None
        self._cause: Cause | None = None
        self._step: StepKind | None = None
        self._outcome: str | None = None
        self._refused: str | None = None
        self._ctx: AttemptContext | None = None

    @property
    def ctx(self) -> AttemptContext:
        """What is known of the attempt now."""
        ctx = self._ctx
        if ctx is None:
            ctx = self._ctx = AttemptContext(
                self.key,
                self.attempt,
                self.tool,
                self._session,
                self._effect,
                self._cause,
                self._step,
                self._outcome,
                self._refused,
            )
        return ctx

    def phase(self, phase: Phase) -> AbstractContextManager[None]:
        plan = self._plans[phase]
        return _UNWATCHED if plan is None else _Boundary(self, phase, plan)

    def parsed(self, session: str) -> None:
        self._session = session
        self._ctx = None

    def claimed(self, effect: str) -> None:
        self._effect = effect
        self._ctx = None

    def ran(self, cause: Cause) -> None:
        self._cause = cause
        self._ctx = None

    def finished(self, step: Step) -> None:
        """The ledger's step; a finished call's outcome is its status, any other its kind."""
        self._step = step.kind
        self._outcome = step.status if step.kind is StepKind.FINISHED else step.kind
        self._ctx = None

    def not_run(self, outcome: str, refused: str | None = None) -> None:
        """The delivery ends without running the tool: `outcome` for the trace, and `refused`,
        the claim's refusal to show in Flower (None: not shown as refused, e.g. handed back)."""
        self._outcome = outcome
        self._refused = refused
        self._ctx = None


#: A phase no hook hangs on: nothing to call, nothing to allocate.
_UNWATCHED = nullcontext()


class _Boundary:
    """The hooks around one phase of one attempt (a `with` block)."""

    __slots__ = ("_phase", "_phases", "_plan", "_tokens")

    def __init__(self, phases: AttemptPhases, phase: Phase, plan: _Plan) -> None:
        self._phases = phases
        self._phase = phase
        self._plan = plan
        self._tokens: list[object] | tuple[()] = ()

    def __enter__(self) -> None:
        entering = self._plan.entering
        if not entering:
            return
        ctx = self._phases.ctx
        self._tokens = tokens = []
        try:
            for hook in entering:
                tokens.append(hook.enter(self._phase, ctx))
        except BaseException as e:  # the hooks entered so far are exited, as `with` would
            self._exit(e)
            raise

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        if self._plan.exiting:
            self._exit(error)

    def _exit(self, error: BaseException | None) -> None:
        exiting = self._plan.exiting
        ctx = self._phases.ctx
        phase = self._phase
        tokens = self._tokens
        entered = len(tokens)
        for hook, at in exiting:
            if at < entered:  # entered (or never meant to): a hook that failed to enter is not
                hook.exit(phase, ctx, tokens[at] if at >= 0 else None, error)
