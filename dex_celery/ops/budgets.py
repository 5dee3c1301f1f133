"""What write budgets show to people (S13.1.5): `budgets show`, `calls show`, the web app and
the metrics read one budget scope's used, held and left through here.

The ledger holds a scope's totals in its current life; a scope it does not hold (never used in
this life, idle and expired, or lost) is counted from SQL the way a rebuild would count it
(`store/budgets.py`), read-only. Limits are the budget as declared now (tools' policies and the
settings); each call keeps the limit it was judged by in its own record.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass
from typing import Any

from dex_celery.engine import RuntimeSource
from dex_celery.model.budgets import (
    Budget,
    BudgetCharge,
    BudgetScope,
    charges_of_json,
)
from dex_celery.model.records import ToolCallRecord


@dataclass(frozen=True, slots=True)
class BudgetView:
    """One budget scope now: what is used (reserved and spent), held and left."""

    name: str
    scope: str
    limit: int
    measure: str
    unit: str
    window: float
    reserved: float
    spent: float
    held: float
    #: Where the totals came from: `ledger`, or `sql` (the ledger holds no such scope now).
    source: str

    @property
    def used(self) -> float:
        return self.reserved + self.spent

    @property
    def left(self) -> float:
        return max(0.0, self.limit - self.used - self.held)

    def as_dict(self) -> dict[str, Any]:
        return {**asdict(self), "used": self.used, "left": self.left}


def declared_budgets(source: RuntimeSource, tools: Iterable[Any] = ()) -> dict[str, Budget]:
    """Every budget declared now: tools' policies, then the settings (which win by name)."""
    out: dict[str, Budget] = {}
    for tool in tools:
        for budget in tool.policy.budgets:
            out.setdefault(budget.name, budget)
    for budget in source.runtime.settings.budget_list:
        out[budget.name] = budget
    return out


def view(source: RuntimeSource, charge: BudgetCharge) -> BudgetView:
    """One scope's totals, with `charge`'s limit and window."""
    runtime = source.runtime
    ledger = runtime.ledger
    totals = ledger.read_budget(
        ledger.keys.budget(charge.name, charge.scope_id), window=charge.window
    )
    where = "ledger"
    if totals is None:
        where = "sql"
        counted = runtime.store.count_charges(charge, now=ledger.now())
        by = {"r": 0.0, "p": 0.0, "s": 0.0, "h": 0.0}
        for c in counted:
            by[c.state] += c.amount
        totals = (by["r"] + by["p"], by["s"], by["h"])
    reserved, spent, held = totals
    return BudgetView(
        charge.name,
        charge.scope_id,
        charge.limit,
        charge.measure,
        charge.unit,
        charge.window,
        reserved,
        spent,
        held,
        where,
    )


def charge_for(budget: Budget, scope_id: str) -> BudgetCharge:
    """A charge of nothing to `budget` in the scope `scope_id` (`session:<id>`, ...): what
    `view` needs to read the scope."""
    kind, _, value = scope_id.partition(":")
    return BudgetCharge(
        budget.name,
        BudgetScope(kind),
        value,
        budget.limit,
        budget.window_seconds,
        budget.measure,
        budget.over,
        0,
        budget.unit,
    )


def scope_views(
    source: RuntimeSource,
    declared: Mapping[str, Budget],
    *,
    budget: str | None = None,
    scope: str | None = None,
) -> list[BudgetView]:
    """Every scope SQL knows charges of (at most 1000), filtered, as `budgets show` lists."""
    views = []
    for name, scope_id in source.runtime.store.budget_scopes(budget=budget, scope=scope):
        declaration = declared.get(name)
        if declaration is None:
            continue  # no longer declared: nothing is judged against it
        views.append(view(source, charge_for(declaration, scope_id)))
    return views


def call_budgets(source: RuntimeSource, record: ToolCallRecord) -> list[dict[str, Any]]:
    """A call's charges as recorded (the limit it was judged by) and each scope now."""
    out = []
    for charge in charges_of_json(record.budgets):
        now = view(source, charge)
        out.append(
            {
                "name": charge.name,
                "scope": charge.scope_id,
                "limit": charge.limit,
                "amount": charge.amount,
                "measure": charge.measure,
                "unit": charge.unit,
                "over": charge.over.value,
                "now": now.as_dict(),
            }
        )
    return out


def render_views(views: Iterable[BudgetView]) -> list[list[str]]:
    """Rows of the `budgets show` table."""
    return [
        [
            v.name,
            v.scope,
            _num(v.limit),
            _num(v.used),
            _num(v.held),
            _num(v.left),
            v.unit if v.measure == "count" else f"{v.measure} ({v.unit})",
        ]
        for v in views
    ]


BUDGET_COLUMNS = ["BUDGET", "SCOPE", "LIMIT", "USED", "HELD", "LEFT", "MEASURE"]


def _num(value: float) -> str:
    return str(int(value)) if float(value).is_integer() else f"{value:g}"


def budget_lines(budgets: list[dict[str, Any]], reason: str | None) -> list[str]:
    """`calls show`'s lines of a call's budgets."""
    lines = []
    if reason:
        lines.append(f"budget    over: {reason}")
    for b in budgets:
        now = b["now"]
        lines.append(
            f"budget    {b['name']} {b['scope']}: this call {b['amount']} of limit {b['limit']}"
            f" (when requested); now used {_num(now['used'])}, held {_num(now['held'])}, "
            f"left {_num(now['left'])}"
        )
    return lines
