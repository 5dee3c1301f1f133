"""The Celery app of the outcome-extension client tests: the tools of
`devtools.mcp_outcome_server` (a third-party-style server of `dex-celery/outcome`), registered
with `dex.add_mcp_server` at `$DEX_TEST_OUTCOME_URL` (a TCP proxy the test can cut).

Built on first access of `app` or `dex` (`lazy_app`); it shares the worker-ready signal of
`tests.support.mcp.tools_app`.
"""

from __future__ import annotations

import os
from typing import Any

from celery import Celery

from dex_celery import Dex, EffectClass, Settings, ToolPolicy
from tests.support.mcp import tools_app  # noqa: F401  (its worker-ready signal)
from tests.support.mcp.lazy_app import lazy_app

URL_ENV = "DEX_TEST_OUTCOME_URL"

#: Writes that need no approval: the tests are about what the server says of each call.
_WRITE = ToolPolicy(effect=EffectClass.NON_IDEMPOTENT_WRITE, requires_approval=False)


def make_app(settings: Settings | None = None) -> tuple[Celery, Dex]:
    settings = settings or Settings.from_env()
    app = Celery("dex_test_outcome")
    dex = Dex(app, settings)
    dex.add_mcp_server(
        "bank",
        url=os.environ[URL_ENV],
        policies={"charge": _WRITE, "refuse": _WRITE, "vague": _WRITE},
        connect_timeout=10,
    )
    return app, dex


_built: dict[str, Any] = {}
__getattr__ = lazy_app(make_app, _built)
