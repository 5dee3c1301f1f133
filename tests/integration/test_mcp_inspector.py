"""The MCP Inspector's CLI (npm `@modelcontextprotocol/inspector`, the command docs/mcp.md shows)
lists and calls the tools of `dex-celery mcp` on the newest revision (`--protocol-era modern`,
2026-07-28), over streamable HTTP and stdio, with a real worker running the tools. Skipped
where `npx` is missing (`.ci/run` installs Node.js)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from collections.abc import Callable
from typing import Any

import pytest
from mcp_types import SERVER_INFO_META_KEY

from dex_celery import CallStatus, Dex
from dex_celery.integrations.mcp_client import IDEMPOTENCY_META_KEY
from dex_celery.integrations.mcp_outcome import OUTCOME_META_KEY
from tests.integration.test_mcp_server import APP, DEX_CELERY, _server
from tests.support.crash import lines
from tests.support.processes import ROOT, Worker

INSPECTOR = "@modelcontextprotocol/inspector@2.12.0"

pytestmark = pytest.mark.skipif(shutil.which("npx") is None, reason="npx (Node.js) is missing")


def inspector(env: dict[str, str], target: list[str], *args: str) -> Any:
    """Run `npx @modelcontextprotocol/inspector --cli ARGS --protocol-era modern TARGET`; its
    JSON."""
    done = subprocess.run(
        ["npx", "--yes", INSPECTOR, "--cli", *args, "--protocol-era", "modern", *target],
        cwd=ROOT,
        env={**os.environ, **env, "PYTHONPATH": str(ROOT)},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, (done.stdout, done.stderr)
    return json.loads(done.stdout)


@pytest.mark.parametrize("transport", ["http", "stdio"])
def test_the_inspector_cli_lists_and_calls_dex_tools_on_the_newest_revision(
    transport: str, dex: Dex, env: dict[str, str], start_worker: Callable[..., Worker]
) -> None:
    start_worker()
    with _server(transport, env) as target:
        if transport == "http":
            where: list[str] = [target]
        else:
            server_env = {**env, "PYTHONPATH": str(ROOT)}
            where = [a for k, v in server_env.items() for a in ("-e", f"{k}={v}")]
            where += ["--cwd", str(ROOT), "--", DEX_CELERY, *APP]
        listed = inspector(env, where, "--method", "tools/list")
        called = inspector(
            env, where, "--method", "tools/call", "--tool-name", "echo", "--tool-arg", "x=1"
        )
    assert "guarded_write" in {t["name"] for t in listed["tools"]}
    meta = called["_meta"]
    # Stamped on 2026-07-28 answers only: the Inspector spoke the newest revision.
    assert SERVER_INFO_META_KEY in meta
    assert meta[OUTCOME_META_KEY] == "executed"
    key = meta[IDEMPOTENCY_META_KEY]
    assert dex.client().get_call(key).status is CallStatus.SUCCEEDED
    assert len(lines(key, "start")) == 1
