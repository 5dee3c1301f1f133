"""The Celery app of the remote-task client tests: a second dex deployment whose tools are those
of a `dex-celery mcp` server (the first deployment, `devtools.toolapp`, which serves tasks),
registered with `dex.add_mcp_server` at `$DEX_TEST_REMOTE_TASKS_URL` (a TCP proxy the test can
cut). `r_*` tools have a long time limit, `s_*` tools a short one (the same remote tools).

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

URL_ENV = "DEX_TEST_REMOTE_TASKS_URL"
#: Seconds of start-to-close of the `s_*` tools.
SHORT_LIMIT = 8.0

_LONG = ToolPolicy(
    effect=EffectClass.NON_IDEMPOTENT_WRITE,
    requires_approval=False,
    repeat_guard=False,
    start_to_close=90.0,
)
_SHORT = ToolPolicy(
    effect=EffectClass.NON_IDEMPOTENT_WRITE,
    requires_approval=False,
    repeat_guard=False,
    start_to_close=SHORT_LIMIT,
)


def make_app(settings: Settings | None = None) -> tuple[Celery, Dex]:
    settings = settings or Settings.from_env()
    app = Celery("dex_test_remote_tasks")
    dex = Dex(app, settings)
    url = os.environ[URL_ENV]
    dex.add_mcp_server(
        "remote",
        url=url,
        prefix="r_",
        tools=["slow_non_idempotent_write"],
        policy=_LONG,
        connect_timeout=10,
    )
    dex.add_mcp_server(
        "remote_short",
        url=url,
        prefix="s_",
        tools=["slow_non_idempotent_write", "guarded_write"],
        policy=_SHORT,
        connect_timeout=10,
    )
    return app, dex


_built: dict[str, Any] = {}
__getattr__ = lazy_app(make_app, _built)
