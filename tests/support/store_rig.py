"""The SQL store's test rig: a fake clock, a fresh SQLite file or PostgreSQL database per test, and a new call."""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlalchemy import create_engine, text
from sqlalchemy.exc import OperationalError

from dex_celery import Settings
from dex_celery.engine.dispatch import admit
from dex_celery.model.ids import CallKey
from dex_celery.model.policy import EffectClass, ToolPolicy, resolve_policy
from dex_celery.store.values import Admission, NewCall

SETTINGS = Settings()


class Clock:
    def __init__(self, now: float = 1_000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def _postgres_url() -> str:
    return os.environ.get(
        "DEX_TEST_POSTGRES_URL", "postgresql+psycopg://postgres@127.0.0.1:5432/test"
    )


@pytest.fixture(params=["sqlite", "postgresql"])
def url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path / 'store.db'}"
        return
    base = _postgres_url()
    admin = create_engine(base, isolation_level="AUTOCOMMIT")
    try:
        with admin.connect() as conn:
            conn.execute(text("select 1"))
    except OperationalError as e:
        admin.dispose()
        pytest.skip(f"PostgreSQL at {base} is unreachable: {e.orig}")
    schema = f"dex_test_{uuid.uuid4().hex[:12]}"
    with admin.connect() as conn:
        conn.execute(text(f'CREATE SCHEMA "{schema}"'))
    sep = "&" if "?" in base else "?"
    try:
        yield f"{base}{sep}options=-csearch_path%3D{schema}"
    finally:
        with admin.connect() as conn:
            conn.execute(text(f'DROP SCHEMA "{schema}" CASCADE'))
        admin.dispose()


def new_call(
    key: str,
    *,
    effect: EffectClass | None = EffectClass.READ,
    requires_approval: bool | None = None,
    approval_timeout: float | None = None,
    arguments: str = '{"q":1}',
    tool: str = "echo",
) -> NewCall:
    policy = ToolPolicy(
        effect=effect, requires_approval=requires_approval, approval_timeout=approval_timeout
    )

    def resolve(default: EffectClass | None, now: float) -> Admission:
        return admit(resolve_policy(policy, None, default, SETTINGS), now)

    return NewCall(CallKey.parse(key), tool, arguments, resolve)
