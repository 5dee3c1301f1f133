"""Write budgets (S13.1): how many calls, or how much of one argument, a group of tools may use.

A `Budget` is what a tool's policy or the settings declare; a `BudgetCharge` is what one call
owes one budget, fixed when it is requested (the scope's value, the limit, the amount taken from
the validated arguments the tool receives). The charge is recorded with the call, as the policy
snapshot is (S1.5), so a budget changed later applies to later calls only. The ledger reserves,
spends, holds and releases charges (`ledger/scripts/open.lua`, `recorded.lua`, `budget_*.lua`;
docs/guardrails.md, "Budgets").
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from enum import StrEnum
from functools import lru_cache
from typing import Any

from dex_celery.errors import InvalidToolArguments, PolicyError
from dex_celery.model.ids import validate_id
from dex_celery.model.times import parse_seconds

#: A budget's name: what `budgets show` and metrics call it, and part of its Redis key.
_NAME = re.compile(r"[a-z][a-z0-9_.-]{0,62}")
#: The measure that counts calls; any other measure names an argument to sum.
COUNT = "count"
#: Window names and their length in seconds; 0 is the session's lifetime (nothing expires).
WINDOWS = {"session": 0.0, "minute": 60.0, "hour": 3600.0, "day": 86400.0}


class BudgetScope(StrEnum):
    """Whose budget a call draws on."""

    SESSION = "session"  # the call's session
    PRINCIPAL = "principal"  # the user or tenant the app passed with the request
    DEPLOYMENT = "deployment"  # every call of the deployment


class OverBudget(StrEnum):
    """What becomes of a call over its budget."""

    WAIT = "wait"  # it waits for a person, saying why (the default)
    REJECT = "reject"  # it ends `rejected`, with text the model can act on


@dataclass(frozen=True, slots=True)
class Budget:
    """A write budget. Declare it in a tool's policy (`ToolPolicy(budgets=...)`), or in the
    settings (`DEX_BUDGETS`) naming its tools; tools declaring one name share it (a group).

    Attributes:
        name: The budget's name (lowercase letters, digits, `_.-`).
        limit: How much may be used in the window: calls, or the sum of `measure`.
        scope: Whose budget: the session, the request's principal, or the deployment.
        window: `session` (the session's lifetime) or a rolling `minute`, `hour`, `day`, or a
            duration (`30m`, `2h`).
        measure: `count`, or the name of a numeric argument to sum (e.g. `amount_cents`).
        over: `wait` for a person (default) or `reject` a call over the budget.
        tools: The tools it applies to, when declared in the settings.
        label: What one unit is called in texts ("refunds"); the name when unset.
    """

    name: str
    limit: int
    scope: BudgetScope = BudgetScope.SESSION
    window: str = "session"
    measure: str = COUNT
    over: OverBudget = OverBudget.WAIT
    tools: tuple[str, ...] = ()
    label: str = ""

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not _NAME.fullmatch(self.name):
            raise PolicyError(
                f"budget name {self.name!r} must be lowercase letters, digits, '_', '.', '-'"
            )
        if isinstance(self.limit, bool) or not isinstance(self.limit, int) or self.limit < 0:
            raise PolicyError(f"budget {self.name}: limit must be a whole number >= 0")
        try:
            object.__setattr__(self, "scope", BudgetScope(self.scope))
            object.__setattr__(self, "over", OverBudget(self.over))
        except ValueError as e:
            raise PolicyError(f"budget {self.name}: {e}") from None
        if self.window_seconds == 0 and self.scope is not BudgetScope.SESSION:
            raise PolicyError(
                f"budget {self.name}: window 'session' needs scope 'session'; give a rolling "
                "window (minute, hour, day, or a duration) for a principal or the deployment"
            )
        if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]{0,62}", self.measure):
            raise PolicyError(f"budget {self.name}: measure must be 'count' or an argument name")
        if isinstance(self.tools, str):
            raise PolicyError(f"budget {self.name}: tools must be a tuple of tool names")

    @property
    def window_seconds(self) -> float:
        if self.window in WINDOWS:
            return WINDOWS[self.window]
        try:
            seconds = parse_seconds(self.window, option=f"budget {self.name} window")
        except ValueError as e:
            raise PolicyError(str(e)) from None
        if seconds <= 0 or not math.isfinite(seconds):
            raise PolicyError(f"budget {self.name}: a rolling window must be positive")
        return seconds

    @property
    def unit(self) -> str:
        return self.label or self.name


@lru_cache(maxsize=64)
def parse_budgets(text: str | None) -> tuple[Budget, ...]:
    """The `budgets` setting: `;`-separated budgets, each `NAME: key=value ...`, e.g.
    `refunds: tools=refund_order+credit_note limit=3 scope=session window=session`."""
    if not text or not text.strip():
        return ()
    out: list[Budget] = []
    for part in filter(None, (p.strip() for p in text.split(";"))):
        name, colon, rest = part.partition(":")
        if not colon:
            raise PolicyError(f"budget {part!r} must read 'NAME: limit=N ...'")
        fields: dict[str, Any] = {}
        for item in rest.split():
            key, eq, value = item.partition("=")
            if not eq or key not in {
                "limit",
                "scope",
                "window",
                "measure",
                "over",
                "tools",
                "label",
            }:
                raise PolicyError(f"budget {name.strip()}: cannot read {item!r}")
            fields[key] = value
        if "limit" not in fields:
            raise PolicyError(f"budget {name.strip()}: limit=N is required")
        try:
            fields["limit"] = int(fields["limit"])
        except ValueError:
            raise PolicyError(f"budget {name.strip()}: limit must be a whole number") from None
        fields["tools"] = tuple(filter(None, fields.get("tools", "").split("+")))
        fields["label"] = fields.get("label", "").replace("_", " ")
        out.append(Budget(name.strip(), **fields))
    names = [b.name for b in out]
    if len(set(names)) != len(names):
        raise PolicyError("a budget name is declared twice in the budgets setting")
    return tuple(out)


def budgets_for(
    tool_name: str, declared: Sequence[Budget], configured: Sequence[Budget]
) -> tuple[Budget, ...]:
    """The budgets a tool's calls draw on: those its policy declares and those the settings
    name it in. A budget the settings declare replaces a policy's budget of the same name (an
    operator changes a limit without a deploy)."""
    by_name = {b.name: b for b in declared}
    for b in configured:
        if tool_name in b.tools or b.name in by_name:
            by_name[b.name] = b
    return tuple(by_name[n] for n in sorted(by_name))


@dataclass(frozen=True, slots=True)
class BudgetCharge:
    """What one call owes one budget, fixed at its request and recorded with it."""

    name: str
    scope: BudgetScope
    #: The session id, the principal, or '' for the deployment.
    scope_value: str
    limit: int
    window: float
    measure: str
    over: OverBudget
    amount: int
    unit: str

    @property
    def scope_id(self) -> str:
        """The scope as one text: `session:<id>`, `principal:<name>`, `deployment`."""
        if self.scope is BudgetScope.DEPLOYMENT:
            return "deployment"
        return f"{self.scope.value}:{self.scope_value}"

    def where(self) -> str:
        if self.scope is BudgetScope.SESSION:
            return "in this session"
        if self.scope is BudgetScope.PRINCIPAL:
            return f"for {self.scope_value}"
        return "in this deployment"

    def window_text(self) -> str:
        if self.window == 0:
            return ""
        for name, seconds in WINDOWS.items():
            if seconds == self.window:
                return f" in the last {name}"
        return f" in the last {self.window:g} s"

    def over_text(self, used: float, held: float) -> str:
        """Why a call is over this budget, as every surface shows it and the model reads it:
        "3 of 3 refunds in this session already used or in doubt"."""
        taken = _num(used + held)
        of = f"{taken} of {self.limit} {self.unit}"
        if self.measure != COUNT:
            of = f"{taken} of {self.limit} {self.measure} ({self.unit})"
        return (
            f"{of} {self.where()}{self.window_text()} already used or in doubt; this call needs "
            f"{self.amount} more"
        )


def _num(value: float) -> str:
    return str(int(value)) if float(value).is_integer() else f"{value:g}"


def charge_of(
    budget: Budget,
    received: Mapping[str, Any],
    *,
    session_id: str,
    principal: str | None,
    tool_name: str,
) -> BudgetCharge:
    """The charge of one call to `budget`, its amount read from the validated arguments the tool
    receives (`tools/call_identity.py`), never from the raw request."""
    if budget.measure == COUNT:
        amount = 1
    else:
        value = received.get(budget.measure)
        if isinstance(value, bool) or not isinstance(value, int | float) or value < 0:
            raise InvalidToolArguments(
                f"tool {tool_name!r}: budget {budget.name} sums argument {budget.measure!r}, "
                f"which must be a whole number >= 0; got {value!r}"
            )
        if isinstance(value, float) and not value.is_integer():
            raise InvalidToolArguments(
                f"tool {tool_name!r}: budget {budget.name} sums argument {budget.measure!r}, "
                f"which must be a whole number; got {value!r}"
            )
        amount = int(value)
    if budget.scope is BudgetScope.SESSION:
        scope_value = session_id
    elif budget.scope is BudgetScope.PRINCIPAL:
        if principal is None:
            raise InvalidToolArguments(
                f"tool {tool_name!r} draws on budget {budget.name}, which is kept per principal: "
                "pass the request's principal (user or tenant)"
            )
        scope_value = validate_id("principal", principal)
    else:
        scope_value = ""
    return BudgetCharge(
        budget.name,
        budget.scope,
        scope_value,
        budget.limit,
        budget.window_seconds,
        budget.measure,
        budget.over,
        amount,
        budget.unit,
    )


def charges_json(charges: Sequence[BudgetCharge]) -> str | None:
    """The charges as recorded with the call (None: it draws on no budget)."""
    if not charges:
        return None
    return json.dumps([asdict(c) for c in charges], sort_keys=True, separators=(",", ":"))


@lru_cache(maxsize=1024)
def charges_of_json(text: str | None) -> tuple[BudgetCharge, ...]:
    if not text:
        return ()
    out = []
    for raw in json.loads(text):
        raw["scope"] = BudgetScope(raw["scope"])
        raw["over"] = OverBudget(raw["over"])
        out.append(BudgetCharge(**raw))
    return tuple(out)
