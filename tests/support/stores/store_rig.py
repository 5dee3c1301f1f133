"""The SQL store's test rig: a fake clock, a fresh SQLite file or PostgreSQL database per test, and a new call."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from dex_celery import Settings
from dex_celery.engine.request.dispatch import admit
from dex_celery.model.ids import CallKey
from dex_celery.model.policy import EffectClass, ToolPolicy, resolve_policy
from dex_celery.store.repository import Store
from dex_celery.store.values import Admission, NewCall
from tests.support.stores.databases import POSTGRESQL, SQLITE, database_url

SETTINGS = Settings()


class Clock:
    def __init__(self, now: float = 1_000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


@pytest.fixture(params=[SQLITE, POSTGRESQL])
def url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    with database_url(request.param, tmp_path) as database:
        yield database


@pytest.fixture
def store(url: str) -> Iterator[Store]:
    """A `Store` with its schema on the test's database (`url`), on a fake clock at 1,000."""
    store = Store(url, clock=Clock())
    store.create_schema()
    yield store
    store.engine.dispose()


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
