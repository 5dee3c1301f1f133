"""A private PostgreSQL schema per test, so tests against the shared server never see each other.

The URL it yields sets `search_path` through libpq's `options`, so the test process and the
worker processes it starts (which read `DEX_DATABASE_URL`) all use the same private schema.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from contextlib import contextmanager

from sqlalchemy import create_engine, text
from sqlalchemy.pool import NullPool

DEFAULT_POSTGRES_URL = "postgresql+psycopg://postgres@127.0.0.1:5432/test"


@contextmanager
def postgres_schema() -> Iterator[str]:
    """Create schema `dex_t_<random>`, yield a database URL using it, then drop it."""
    base = os.environ.get("DEX_TEST_POSTGRES_URL", DEFAULT_POSTGRES_URL)
    name = f"dex_t_{uuid.uuid4().hex[:12]}"
    engine = create_engine(base, poolclass=NullPool)
    with engine.begin() as conn:
        conn.execute(text(f'CREATE SCHEMA "{name}"'))
    separator = "&" if "?" in base else "?"
    try:
        yield f"{base}{separator}options=-csearch_path%3D{name}"
    finally:
        with engine.begin() as conn:
            conn.execute(text("SET LOCAL lock_timeout = '20s'"))
            conn.execute(text(f'DROP SCHEMA "{name}" CASCADE'))
        engine.dispose()
