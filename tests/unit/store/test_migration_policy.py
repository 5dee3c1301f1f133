"""Every migration after 0007 is expand-then-contract (docs/deploy.md, "Online schema upgrades";
`dex_celery/store/migrations/__init__.py`).

`dex-celery db upgrade` runs while the previous release's workers and requesters still run, so a
migration's `upgrade()` may only add what old code does not notice: tables, nullable columns (or
columns with a server default), indexes. Removing or changing what old code reads or writes
(drop, rename, a column made NOT NULL or given another type) is a contract step: allowed only in
a migration that names what it removes in a module-level `contracts = (...)`, and only for names
the previous release's code (`tests.support.stores.releases.PREVIOUS_RELEASE`, migrations aside) does
not use. This file checks that over the source of every such migration, with Python's `ast`; the
real-process check of the same promise is tests/integration/store/test_online_migration.py.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.support.stores.releases import files_naming

VERSIONS = Path(__file__).resolve().parents[3] / "dex_celery" / "store" / "migrations" / "versions"
#: The last revision written before the policy: earlier ones are what they are.
POLICY_AFTER = 7
#: Alembic operations that remove or rename something old code may use.
REMOVING = frozenset({"drop_table", "drop_column", "rename_table", "drop_constraint", "drop_index"})
#: `alter_column` arguments that break old code: a rename, a narrower or other type, NOT NULL.
BREAKING_ALTERATIONS = ("new_column_name", "type_")
#: Raw SQL that removes, renames or tightens.
BREAKING_SQL = re.compile(
    r"\b(DROP\s+(TABLE|COLUMN|INDEX|CONSTRAINT)|RENAME\b|SET\s+NOT\s+NULL|ALTER\s+COLUMN\s+\S+\s+(SET\s+DATA\s+)?TYPE)",
    re.IGNORECASE,
)


@dataclass(frozen=True)
class Finding:
    line: int
    what: str
    #: The name of what it removes or changes (a column, table, index, constraint), if given.
    removed: str | None


#: Operations whose last string argument is the column (the table comes first, if given).
_COLUMN_STEPS = frozenset({"drop_column", "alter_column"})


def _removed(name: str, call: ast.Call) -> str | None:
    strings = [
        a.value for a in call.args if isinstance(a, ast.Constant) and isinstance(a.value, str)
    ]
    if not strings:
        return None
    return strings[-1] if name in _COLUMN_STEPS else strings[0]


def _keyword(call: ast.Call, name: str) -> ast.expr | None:
    return next((k.value for k in call.keywords if k.arg == name), None)


def _is_false(node: ast.expr | None) -> bool:
    return isinstance(node, ast.Constant) and node.value is False


def _attribute_calls(tree: ast.AST) -> Iterator[tuple[str, ast.Call]]:
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
            yield node.func.attr, node


def _not_null_without_default(column: ast.expr) -> bool:
    """`sa.Column(..., nullable=False)` with no `server_default`: old INSERTs fail on it."""
    if not (isinstance(column, ast.Call) and isinstance(column.func, ast.Attribute | ast.Name)):
        return False
    name = column.func.attr if isinstance(column.func, ast.Attribute) else column.func.id
    return (
        name == "Column"
        and _is_false(_keyword(column, "nullable"))
        and _keyword(column, "server_default") is None
    )


def breaking_steps(source: str) -> list[Finding]:
    """What `upgrade()` in `source` does that old code would notice."""
    tree = ast.parse(source)
    upgrade = next(
        (n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == "upgrade"), None
    )
    if upgrade is None:
        return []
    found: list[Finding] = []
    for name, call in _attribute_calls(upgrade):
        if name in REMOVING:
            found.append(Finding(call.lineno, name, _removed(name, call)))
        elif name == "alter_column":
            changed = [a for a in BREAKING_ALTERATIONS if _keyword(call, a) is not None]
            if _is_false(_keyword(call, "nullable")):
                changed.append("nullable=False")
            if changed:
                what = f"alter_column({', '.join(changed)})"
                found.append(Finding(call.lineno, what, _removed(name, call)))
        elif name == "add_column":
            if any(_not_null_without_default(a) for a in call.args):
                found.append(Finding(call.lineno, "add_column(NOT NULL, no server_default)", None))
        elif name == "execute":
            for node in ast.walk(call):
                if (
                    isinstance(node, ast.Constant)
                    and isinstance(node.value, str)
                    and BREAKING_SQL.search(node.value)
                ):
                    found.append(Finding(call.lineno, f"execute({node.value[:60]!r})", None))
    return found


def declared_contracts(source: str) -> tuple[str, ...]:
    """The module-level `contracts = ("table", "table.column", "index", ...)`, if any."""
    for node in ast.parse(source).body:
        if isinstance(node, ast.Assign | ast.AnnAssign):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            if any(isinstance(t, ast.Name) and t.id == "contracts" for t in targets):
                assert node.value is not None
                value = ast.literal_eval(node.value)
                return (value,) if isinstance(value, str) else tuple(value)
    return ()


def policy_violations(source: str, used_by_old_code: Callable[[str], list[str]]) -> list[str]:
    """Why `source`, a migration after the policy began, is not expand-then-contract ([]: it is).

    `used_by_old_code(name)`: the previous release's files that name `name`."""
    contracts = declared_contracts(source)
    problems: list[str] = []
    for step in breaking_steps(source):
        if not contracts:
            problems.append(
                f"line {step.line}: {step.what} in an expand migration (old code still runs "
                "against this schema; remove it in a later release's contract migration that "
                "declares `contracts`)"
            )
            continue
        declared = {name.rsplit(".", 1)[-1] for name in contracts}
        if step.removed not in declared:
            problems.append(
                f"line {step.line}: {step.what} removes something `contracts` does not name"
            )
    for name in contracts:
        last = name.rsplit(".", 1)[-1]
        users = used_by_old_code(last)
        if users:
            problems.append(
                f"contracts names {name!r}, which the previous release still uses "
                f"({', '.join(users[:3])}): drop it one release later"
            )
    return problems


def _revision_number(path: Path) -> int | None:
    head = path.name.split("_", 1)[0]
    return int(head) if head.isdigit() else None


def migrations_under_the_policy() -> list[Path]:
    return sorted(
        p
        for p in VERSIONS.glob("*.py")
        if (number := _revision_number(p)) is not None and number > POLICY_AFTER
    )


def test_every_new_migration_is_expand_then_contract() -> None:
    """(None after 0007 yet when this was written: then there is nothing to refuse.)"""
    problems = {
        path.name: found
        for path in migrations_under_the_policy()
        if (found := policy_violations(path.read_text(), files_naming))
    }
    assert problems == {}


# --- the check itself catches what it must ------------------------------------------------------

EXPAND = """
def upgrade():
    op.create_table("dex_new", sa.Column("id", sa.Integer(), primary_key=True))
    op.add_column("dex_tool_calls", sa.Column("note", sa.Text(), nullable=True))
    op.add_column("dex_tool_calls", sa.Column("n", sa.Integer(), nullable=False, server_default="0"))
    op.create_index("ix_note", "dex_tool_calls", ["note"])
    op.alter_column("dex_tool_calls", "error", nullable=True)

def downgrade():
    op.drop_column("dex_tool_calls", "note")
    op.drop_table("dex_new")
"""


def _none_used(name: str) -> list[str]:
    return []


def test_an_expand_migration_passes_and_its_downgrade_may_drop() -> None:
    assert policy_violations(EXPAND, _none_used) == []


@pytest.mark.parametrize(
    ("step", "named"),
    [
        ('op.drop_column("dex_tool_calls", "error")', "drop_column"),
        ('op.drop_table("dex_sessions")', "drop_table"),
        ('op.rename_table("dex_sessions", "dex_chats")', "rename_table"),
        ('op.alter_column("dex_tool_calls", "error", nullable=False)', "nullable=False"),
        ('op.alter_column("dex_tool_calls", "error", new_column_name="err")', "new_column_name"),
        ('op.alter_column("dex_tool_calls", "attempts", type_=sa.SmallInteger())', "type_"),
        (
            'op.add_column("dex_tool_calls", sa.Column("n", sa.Integer(), nullable=False))',
            "NOT NULL",
        ),
        ('op.execute("ALTER TABLE dex_tool_calls RENAME COLUMN error TO err")', "RENAME"),
        ('op.execute(sa.text("alter table t alter column c set not null"))', "set not null"),
        (
            'with op.batch_alter_table("dex_tool_calls") as batch:\n'
            '        batch.drop_column("error")',
            "drop_column",
        ),
    ],
)
def test_a_breaking_step_in_an_expand_migration_is_refused(step: str, named: str) -> None:
    source = f"def upgrade():\n    {step}\n"
    (problem,) = policy_violations(source, _none_used)
    assert named in problem and "expand migration" in problem


def test_a_contract_may_drop_only_what_it_names_and_old_code_no_longer_uses() -> None:
    contract = 'contracts = ("dex_tool_calls.old_note",)\n\ndef upgrade():\n{}\n'
    drop = '    op.drop_column("dex_tool_calls", "old_note")'
    assert policy_violations(contract.format(drop), _none_used) == []
    (unnamed,) = policy_violations(
        contract.format('    op.drop_column("dex_tool_calls", "error")'), _none_used
    )
    assert "does not name" in unnamed
    (still_used,) = policy_violations(contract.format(drop), lambda n: ["dex_celery/x.py"])
    assert "still uses" in still_used and "dex_celery/x.py" in still_used


def test_the_previous_release_is_asked_for_real() -> None:
    """A column the previous release writes is found in its code (so a contract dropping it is
    refused); a name it never had is not."""
    assert "dex_celery/store/schema.py" in files_naming("trace_context")
    assert files_naming("no_such_column_anywhere_xyz") == []
