"""The test deployment's `Dex` made from an environment, one way for the `dex` fixture of
tests/conftest.py and for the fixtures that build theirs from an environment of their own: the
variables set in the test process too (so what it starts inherits them), the schema created."""

from __future__ import annotations

import pytest

from devtools.toolapp import make_app
from dex_celery import Dex, Settings


def dex_of(env: dict[str, str], monkeypatch: pytest.MonkeyPatch) -> Dex:
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    _app, dex = make_app(Settings.from_env(env))
    dex.store.create_schema()
    return dex
