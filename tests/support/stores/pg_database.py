"""A fresh PostgreSQL database per test, for tests that need a whole database (schemas,
version tables) rather than a private schema in the shared one."""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from contextlib import contextmanager

import pytest
from sqlalchemy import create_engine, text
from sqlalchemy.engine import make_url
from sqlalchemy.exc import OperationalError

from devtools.pg_schema import DEFAULT_POSTGRES_URL


@contextmanager
def fresh_database(prefix: str) -> Iterator[str]:
    """Create database `<prefix>_<random>`, yield its URL, then drop it (skip if no server)."""
    base = make_url(os.environ.get("DEX_TEST_POSTGRES_URL", DEFAULT_POSTGRES_URL))
    name = f"{prefix}_{uuid.uuid4().hex[:10]}"
    admin = create_engine(base, isolation_level="AUTOCOMMIT")
    try:
        with admin.connect() as conn:
            conn.execute(text(f'CREATE DATABASE "{name}"'))
    except OperationalError as e:
        admin.dispose()
        pytest.skip(f"PostgreSQL is unreachable: {e.orig}")
    try:
        yield base.set(database=name).render_as_string(hide_password=False)
    finally:
        with admin.connect() as conn:
            conn.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
        admin.dispose()
