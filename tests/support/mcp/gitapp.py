"""The Celery app of the `mcp-server-git` test: the tools of that PyPI server (trusted
annotations, prefix `git_`), limited to the repository `$DEX_TEST_GIT_REPO`.

After each task the worker process writes how many sessions of the server it opened, and how
many tasks it ran, to `$DEX_TEST_MCP_LOG/opened` (the warm-session witness).
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

from celery import Celery, signals

from devtools.mcp_tools_server import LOG_ENV
from dex_celery import Dex, Settings
from dex_celery.integrations.mcp.sessions import pool
from tests.support.mcp import tools_app  # noqa: F401  (its worker-ready signal)
from tests.support.mcp.lazy_app import lazy_app

REPO_ENV = "DEX_TEST_GIT_REPO"


def make_app(settings: Settings | None = None) -> tuple[Celery, Dex]:
    settings = settings or Settings.from_env()
    app = Celery("dex_test_git")
    dex = Dex(app, settings)
    dex.add_mcp_server(
        "git",
        command=[sys.executable, "-m", "mcp_server_git", "--repository", os.environ[REPO_ENV]],
        prefix="git_",
        trust="annotations",
    )
    return app, dex


_built: dict[str, Any] = {}
__getattr__ = lazy_app(make_app, _built)


_tasks_run = [0]


@signals.task_postrun.connect
def _count_sessions(**_: Any) -> None:
    """Write `<sessions opened> <tasks run>` atomically: the caller learns a call's outcome from
    the ledger before this signal runs, so the test waits for the count of its last task."""
    folder = os.environ.get(LOG_ENV)
    if folder:
        _tasks_run[0] += 1
        target = Path(folder) / "opened"
        partial = target.with_suffix(f".{os.getpid()}")
        partial.write_text(f"{pool().stats().opened.get('git', 0)} {_tasks_run[0]}")
        partial.replace(target)
