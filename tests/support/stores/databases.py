"""The SQL database a test's deployment runs on: SQLite by default, the running PostgreSQL (a
private schema) for tests marked `ON_BOTH_DATABASES` (the `database_kind` fixture of
tests/conftest.py)."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from devtools.pg_schema import postgres_schema

SQLITE = "sqlite"
POSTGRESQL = "postgresql"

#: Runs a test once on SQLite and once on PostgreSQL.
ON_BOTH_DATABASES = pytest.mark.parametrize("database_kind", [SQLITE, POSTGRESQL], indirect=True)


@contextmanager
def database_url(kind: str, directory: Path) -> Iterator[str]:
    """A database URL of `kind`: a SQLite file in `directory`, or a private PostgreSQL schema
    dropped on exit."""
    if kind == SQLITE:
        yield f"sqlite:///{directory / 'dex.db'}"
        return
    with postgres_schema() as url:
        yield url
