"""The Celery app of the MCP tests: the tools of `devtools.mcp_tools_server`, registered
with `dex.add_mcp_server`, over stdio (default) or streamable HTTP (`$DEX_TEST_MCP_URL`).

The app is built on first access of `app` or `dex` (`lazy_app`), so importing this module
starts no MCP server; `celery -A tests.support.mcp.tools_app worker` builds it at start-up.
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path
from typing import Any

from celery import Celery, signals

from devtools.mcp_tools_server import EXTRA_TOOL_ENV, FAIL_START_ENV, LOG_ENV
from devtools.processes import ROOT
from dex_celery import Dex, EffectClass, Settings, ToolPolicy
from tests.support.mcp.lazy_app import lazy_app

URL_ENV = "DEX_TEST_MCP_URL"
READY_ENV = "DEX_TEST_MCP_READY"
#: Set to `1`: the app also registers servers that cannot be reached: `gone` (a stdio command
#: that exits at once), `gone_http` (a URL nothing listens on; `$DEX_TEST_MCP_DEAD_URL`) and
#: `flaky` (the test server, prefix `f_`, logging to `<log>/flaky`, which exits at start while
#: `<log>/flaky/fail-start` exists).
DEAD_ENV = "DEX_TEST_MCP_DEAD"
DEAD_URL_ENV = "DEX_TEST_MCP_DEAD_URL"

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
    return [sys.executable, "-m", "devtools.mcp_tools_server"]


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
    if os.environ.get(DEAD_ENV) == "1":
        add_dead_servers(dex)
    return app, dex


def add_dead_servers(dex: Dex) -> None:
    """See `DEAD_ENV`."""
    dex.add_mcp_server(
        "gone",
        command=[sys.executable, "-c", "raise SystemExit(3)"],
        prefix="g_",
        connect_timeout=10,
    )
    dex.add_mcp_server(
        "gone_http",
        url=os.environ.get(DEAD_URL_ENV, "http://127.0.0.1:9/mcp"),
        prefix="gh_",
        connect_timeout=10,
    )
    flaky_log = str(Path(os.environ.get(LOG_ENV, "/tmp/dex-test-mcp-log")) / "flaky")
    dex.add_mcp_server(
        "flaky",
        command=server_command(),
        cwd=str(ROOT),
        env={"PYTHONPATH": str(ROOT), LOG_ENV: flaky_log, FAIL_START_ENV: "1"},
        prefix="f_",
        trust="annotations",
        connect_timeout=20,
    )


_built: dict[str, Any] = {}
__getattr__ = lazy_app(make_app, _built)


@signals.worker_ready.connect
def _announce_ready(sender: Any = None, **_: Any) -> None:
    folder = os.environ.get(READY_ENV)
    if folder:
        (Path(folder) / f"ready-{os.getpid()}").write_text(str(time.time()))
