"""The Celery app of the MCP tests: the tools of `tests.support.mcp_tools_server`, registered
with `dex.add_mcp_server`, over stdio (default) or streamable HTTP (`$DEX_TEST_MCP_URL`).

The app is built on first access of `app` or `dex` (module `__getattr__`), so importing this
module starts no MCP server; `celery -A tests.support.mcpapp worker` builds it at start-up.
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path
from typing import Any

from celery import Celery, signals

from dex_celery import Dex, EffectClass, Settings, ToolPolicy
from tests.support.mcp_tools_server import EXTRA_TOOL_ENV, LOG_ENV
from tests.support.processes import ROOT

URL_ENV = "DEX_TEST_MCP_URL"
READY_ENV = "DEX_TEST_MCP_READY"

#: Overrides given to `add_mcp_server` (S1.4): a policy beats the tool's annotations.
POLICIES = {
    # Annotated idempotent; the policy says otherwise and wins.
    "set_status": ToolPolicy(effect=EffectClass.NON_IDEMPOTENT_WRITE, requires_approval=False),
    # Annotated with a title only (MCP's defaults make it a write); the policy makes it a read.
    "titled": ToolPolicy(effect=EffectClass.READ),
    # No effect given: the class still comes from the annotations; only approval is overridden.
    "slow_cancel": ToolPolicy(requires_approval=False),
    "bare": ToolPolicy(requires_approval=False),
}


def server_command() -> list[str]:
    return [sys.executable, "-m", "tests.support.mcp_tools_server"]


def make_app(settings: Settings | None = None) -> tuple[Celery, Dex]:
    settings = settings or Settings.from_env()
    app = Celery("dex_test_mcp")
    dex = Dex(app, settings)
    url = os.environ.get(URL_ENV)
    where: dict[str, Any] = (
        {"url": url}
        if url
        else {
            "command": server_command(),
            "cwd": str(ROOT),
            "env": {
                "PYTHONPATH": str(ROOT),
                LOG_ENV: os.environ.get(LOG_ENV, ""),
                EXTRA_TOOL_ENV: os.environ.get(EXTRA_TOOL_ENV, ""),
            },
        }
    )
    # Our own test server: its annotations are believed (the tests are about them).
    dex.add_mcp_server("orders", policies=POLICIES, trust="annotations", **where)
    return app, dex


_built: dict[str, Any] = {}


def __getattr__(name: str) -> Any:
    if name in ("app", "dex"):
        if not _built:
            _built["app"], _built["dex"] = make_app()
        return _built[name]
    raise AttributeError(name)


@signals.worker_ready.connect
def _announce_ready(sender: Any = None, **_: Any) -> None:
    folder = os.environ.get(READY_ENV)
    if folder:
        (Path(folder) / f"ready-{os.getpid()}").write_text(str(time.time()))
