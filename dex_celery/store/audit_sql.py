"""The audit log's two writes, compiled once per engine like the hot path's (`store/hot.py`).

An append is one multi-row INSERT of the transaction's entries and one upsert of the writer's
head, both in the caller's transaction: on a `Connection` or on `driver_cursor`'s DBAPI cursor
(the recorder's batch), so no commit and no connection is added to any path.
"""

from __future__ import annotations

import weakref
from dataclasses import dataclass
from typing import Any

from sqlalchemy import Engine, MetaData, Table, bindparam
from sqlalchemy.dialects.postgresql import insert as pg_insert
from sqlalchemy.dialects.sqlite import insert as sqlite_insert

from dex_celery.store.hot import DriverStatement
from dex_celery.store.many_rows import ManyRows, multi_insert
from dex_celery.store.schema import audit_heads, audit_log

ENTRY_COLUMNS = tuple(c.name for c in audit_log.columns if not c.primary_key)
HEAD_COLUMNS = tuple(c.name for c in audit_heads.columns)


@dataclass(frozen=True, slots=True)
class AuditStatements:
    #: A transaction's entries, in one statement (`store/many_rows.py`).
    insert_entries: ManyRows
    upsert_head: DriverStatement


def _tables(engine: Engine) -> tuple[Table, Table]:
    translate = engine.get_execution_options().get("schema_translate_map") or {}
    schema = translate.get(None)
    if schema is None:
        return audit_log, audit_heads
    copies = MetaData()
    return audit_log.to_metadata(copies, schema=schema), audit_heads.to_metadata(
        copies, schema=schema
    )


def _build(engine: Engine) -> AuditStatements:
    log, heads = _tables(engine)
    upsert: Any = pg_insert if engine.dialect.name == "postgresql" else sqlite_insert
    head = upsert(heads).values({c: bindparam(c) for c in HEAD_COLUMNS})
    head = head.on_conflict_do_update(
        index_elements=[heads.c.writer],
        set_={c: head.excluded[c] for c in HEAD_COLUMNS if c != "writer"},
    )
    return AuditStatements(
        insert_entries=multi_insert(log, ENTRY_COLUMNS, engine.dialect),
        upsert_head=DriverStatement.compile(head, engine.dialect),
    )


_compiled: weakref.WeakKeyDictionary[Engine, AuditStatements] = weakref.WeakKeyDictionary()


def audit_statements(engine: Engine) -> AuditStatements:
    """Compiled once per engine (no lock: a race compiles twice and keeps one, as `hot.py`)."""
    found = _compiled.get(engine)
    if found is None:
        found = _compiled.setdefault(engine, _build(engine))
    return found
