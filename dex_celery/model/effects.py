"""Effect classes (S1.2): what each class means is one row of one table, `EFFECT_TABLE`.

Every module that behaves differently per class asks this table (`traits_of`) rather than
naming a class: retries (S3.1, S3.2), the write fence (a claim committed in SQL before any tool
code, docs/ledger.md), what a lost attempt becomes (S4.3), the approval and repeat-guard
defaults (S1.3, S5.4) and the hints MCP clients see (docs/mcp.md). The ledger's Lua scripts get
the flags they need from it too (`ledger_flags`, written into each call's hash when it is
opened; docs/ledger.md, "Effect flags").

`EffectClass` is a string whose value must be a row of the table: `EffectClass("read")` is
`EffectClass.READ`, any other value a typed error (S9.3). Iterating `EffectClass` lists the
table's classes. `register_effect_class` adds a row (one place, the whole system follows); the
four classes of S1.2 are the rows a deployment has.

Every tool task is acknowledged late whatever its class (docs/ledger.md, "Celery options"),
so acknowledgement is not a trait of a class.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field, replace
from functools import lru_cache
from types import MappingProxyType
from typing import ClassVar

from dex_celery.errors import PolicyError, UnknownEffectClass
from dex_celery.model.outcomes import CallStatus, EndReason


@dataclass(frozen=True, slots=True)
class EffectTraits:
    """What one effect class means, everywhere it matters.

    Attributes:
        meaning: What the class means to a person deciding an approval: what approving lets
            happen (shown beside the call, S6).
        read_only: Running the tool changes nothing: a read whose return value is unusable
            failed (`engine/attempt/invoke.encode_result`), and its metadata's `destructiveHint` asks
            for no approval (S1.3).
        retryable: Repeating the tool is harmless, so a call may get more than one attempt
            (S3.1); otherwise it runs at most once (S3.2).
        fenced: No tool code runs before the attempt's claim is committed in SQL (the write
            fence, docs/ledger.md), so SQL can tell whether a lost attempt ran.
        approval_by_default: A call waits for a person unless its policy says otherwise (S1.3).
        repeat_guard_by_default: An identical earlier call that may still run or may have taken
            effect makes a new one wait for a person, unless its policy says otherwise (S5.4).
        lost_status: What a call becomes when its last attempt was lost after reaching a worker
            (S4.3): `failed` when running the tool changed nothing, else `outcome_unknown`.
        lost_reason: The reason recorded with it.
        mcp_hints: The MCP tool annotations dex-celery announces for the class (docs/mcp.md);
            none leaves MCP's defaults (a destructive, non-idempotent write).
    """

    meaning: str
    read_only: bool
    retryable: bool
    fenced: bool
    approval_by_default: bool
    repeat_guard_by_default: bool
    lost_status: CallStatus
    lost_reason: EndReason = EndReason.LOST
    mcp_hints: Mapping[str, bool] = field(default_factory=lambda: MappingProxyType({}))

    def __post_init__(self) -> None:
        if self.lost_status not in (CallStatus.FAILED, CallStatus.OUTCOME_UNKNOWN):
            raise PolicyError(
                f"a lost attempt ends failed or outcome_unknown, not {self.lost_status}"
            )
        if self.retryable and self.fenced:
            # A retried class keeps a Redis-only claim; SQL records one claim per call.
            raise PolicyError("a retryable class cannot be fenced: SQL holds one claim per call")
        if self.mcp_hints.get("readOnlyHint", self.read_only) is not self.read_only:
            raise PolicyError("readOnlyHint must say what read_only says")
        object.__setattr__(self, "mcp_hints", MappingProxyType(dict(self.mcp_hints)))

    @property
    def ledger_flags(self) -> tuple[str, str, str]:
        """The flags the ledger's scripts read from a call hash (docs/ledger.md, "Effect
        flags"): `retry` ('1'/'0'), `lost` (a status) and `lost_reason`."""
        return ("1" if self.retryable else "0", self.lost_status.value, self.lost_reason.value)


class _EffectClassType(type):
    """Iterating `EffectClass` lists the table's classes in the order they were added."""

    def __iter__(cls) -> Iterator[EffectClass]:
        return iter(tuple(_CLASSES.values()))

    def __len__(cls) -> int:
        return len(_CLASSES)


class EffectClass(str, metaclass=_EffectClassType):
    """What a tool does to the world (S1.2); its meaning is its row of `EFFECT_TABLE`."""

    __slots__ = ()

    READ: ClassVar[EffectClass]
    IDEMPOTENT_WRITE: ClassVar[EffectClass]
    NON_IDEMPOTENT_WRITE: ClassVar[EffectClass]
    UNCLASSIFIED: ClassVar[EffectClass]

    def __new__(cls, value: str) -> EffectClass:
        try:
            return _CLASSES[str(value)]
        except KeyError:
            allowed = ", ".join(_CLASSES)
            raise UnknownEffectClass(
                f"unknown effect class {value!r}; expected one of: {allowed}"
            ) from None

    @classmethod
    def parse(cls, value: EffectClass | str) -> EffectClass:
        """Accept the exact string values only; anything else is a typed error (S9.3)."""
        return value if isinstance(value, EffectClass) else cls(value)

    @property
    def value(self) -> str:
        return str.__str__(self)

    @property
    def traits(self) -> EffectTraits:
        return EFFECT_TABLE[self]

    @property
    def retryable(self) -> bool:
        """Only tools whose repetition is harmless get more than one attempt (S3.1, S3.2)."""
        return self.traits.retryable

    @property
    def approval_by_default(self) -> bool:
        """S1.3's default table."""
        return self.traits.approval_by_default

    def __str__(self) -> str:
        return self.value

    def __repr__(self) -> str:
        return f"EffectClass({self.value!r})"

    def __reduce__(self) -> tuple[type[EffectClass], tuple[str]]:
        return (EffectClass, (self.value,))

    def __copy__(self) -> EffectClass:
        return self

    def __deepcopy__(self, memo: object) -> EffectClass:
        return self


_CLASSES: dict[str, EffectClass] = {}
_TABLE: dict[EffectClass, EffectTraits] = {}

#: The one table: effect class -> what it means. Read-only; `register_effect_class` adds rows.
EFFECT_TABLE: Mapping[EffectClass, EffectTraits] = MappingProxyType(_TABLE)


def register_effect_class(value: str, traits: EffectTraits) -> EffectClass:
    """Add a class to the table; every module (and the ledger's scripts) then honours it.

    Register it in every process (requesters, workers, sweepers) before any call of it is
    requested, e.g. where the app is defined. A value may be registered once.
    """
    if not value or value != value.strip() or value in _CLASSES:
        raise PolicyError(f"effect class {value!r} is empty or registered already")
    effect = str.__new__(EffectClass, value)
    _CLASSES[value] = effect
    _TABLE[effect] = traits
    ledger_flags_json.cache_clear()
    return effect


def unregister_effect_class(effect: EffectClass) -> None:
    """Take a class added by `register_effect_class` out again (tests); S1.2's stay."""
    if effect in _BUILT_IN:
        raise PolicyError(f"effect class {effect.value!r} is one of S1.2's and stays")
    del _TABLE[effect]
    del _CLASSES[effect.value]
    ledger_flags_json.cache_clear()


def traits_of(effect: EffectClass | str) -> EffectTraits:
    """The row of `effect`. A stored value the table does not know (written by another release)
    counts as unclassified, the most careful row: a fenced write, run at most once, whose lost
    attempt leaves the outcome unknown."""
    known = _CLASSES.get(str(effect))
    return _TABLE[known if known is not None else EffectClass.UNCLASSIFIED]


def fenced_classes() -> tuple[EffectClass, ...]:
    """The classes whose attempts run only after their claim is committed in SQL."""
    return tuple(c for c, t in _TABLE.items() if t.fenced)


@lru_cache(maxsize=1)
def ledger_flags_json() -> str:
    """Every class's ledger flags as one JSON object, for the scripts' fallback when a call
    hash carries no flags of its own (opened by a release before them; docs/ledger.md)."""
    return json.dumps({c.value: t.ledger_flags for c, t in _TABLE.items()}, sort_keys=True)


_WRITE_HINTS = {"readOnlyHint": False, "destructiveHint": True}

EffectClass.READ = register_effect_class(
    "read",
    EffectTraits(
        meaning="only reads; safe to run again (retried on failure)",
        read_only=True,
        retryable=True,
        fenced=False,
        approval_by_default=False,
        repeat_guard_by_default=False,
        lost_status=CallStatus.FAILED,
        mcp_hints={"readOnlyHint": True, "destructiveHint": False, "idempotentHint": True},
    ),
)
EffectClass.IDEMPOTENT_WRITE = register_effect_class(
    "idempotent_write",
    EffectTraits(
        meaning="changes something, but running it twice has the effect of once "
        "(retried on failure)",
        read_only=False,
        retryable=True,
        fenced=False,
        approval_by_default=False,
        repeat_guard_by_default=False,
        lost_status=CallStatus.OUTCOME_UNKNOWN,
        mcp_hints={**_WRITE_HINTS, "idempotentHint": True},
    ),
)
_AT_MOST_ONCE = EffectTraits(
    meaning="changes something, and running it twice could do it twice: it runs at most "
    "once, never retried; a lost attempt ends outcome_unknown",
    read_only=False,
    retryable=False,
    fenced=True,
    approval_by_default=True,
    repeat_guard_by_default=True,
    lost_status=CallStatus.OUTCOME_UNKNOWN,
    mcp_hints={**_WRITE_HINTS, "idempotentHint": False},
)
EffectClass.NON_IDEMPOTENT_WRITE = register_effect_class("non_idempotent_write", _AT_MOST_ONCE)
#: Treated as a non-idempotent write in everything but its hints: none, so clients apply MCP's
#: defaults (a destructive, non-idempotent write), which is how dex treats it too (S1.2).
EffectClass.UNCLASSIFIED = register_effect_class(
    "unclassified",
    replace(
        _AT_MOST_ONCE,
        meaning="its author did not say what it does: treated as a write that runs at most once",
        mcp_hints={},
    ),
)
_BUILT_IN = frozenset(_CLASSES.values())

#: The class of a call that neither its tool nor its session classifies (S1.4).
UNDECLARED_EFFECT = EffectClass.UNCLASSIFIED
