"""The MCP Inspector's CLI (npm `@modelcontextprotocol/inspector`) lists and calls the tools of
`dex-celery mcp` on the newest revision (2026-07-28): the `npx` commands of docs/mcp.md (and the
README's, the same), run as written against a real server, over streamable HTTP and stdio, with
a real worker running the tools. Skipped where `npx` is missing (`.ci/run` installs Node.js)."""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import subprocess
from collections.abc import Callable
from typing import Any

import pytest
from mcp_types import SERVER_INFO_META_KEY

from devtools.processes import ROOT, Worker
from dex_celery import CallStatus, Dex
from dex_celery.integrations.mcp.outcome import OUTCOME_META_KEY
from dex_celery.integrations.mcp.wire import IDEMPOTENCY_META_KEY
from tests.support.faults.crash import lines
from tests.support.mcp.server import DEX_CELERY, _server

pytestmark = pytest.mark.skipif(shutil.which("npx") is None, reason="npx (Node.js) is missing")

#: Where the docs' commands point, and what the tests' server is.
DOCS_URL = "http://127.0.0.1:8000/mcp"
DOCS_SERVER = ["dex-celery", "-A", "tools_app:dex"]
TEST_SERVER = [DEX_CELERY, "-A", "devtools.toolapp:dex"]


def commands(text: str) -> list[list[str]]:
    return [shlex.split(line) for line in re.findall(r"^npx .*$", text, re.MULTILINE)]


DOCS = commands((ROOT / "docs" / "mcp.md").read_text())


def run(argv: list[str], env: dict[str, str]) -> Any:
    done = subprocess.run(
        argv,
        cwd=ROOT,
        env={**os.environ, **env, "PYTHONPATH": str(ROOT)},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, (argv, done.stdout, done.stderr)
    return json.loads(done.stdout)


def as_tested(argv: list[str], target: str, env: dict[str, str]) -> list[str]:
    """The docs' command against the test's server: its URL, or (stdio) the test's app, with
    the test's environment handed to the server the Inspector starts."""
    argv = [target if a == DOCS_URL else a for a in argv]
    argv = ["echo" if a == "lookup" else a for a in argv]  # the test app's tool
    if "--" not in argv:
        return argv
    cut = argv.index("--")
    server = argv[cut + 1 :]
    assert server[:3] == DOCS_SERVER, server
    handed = [a for k, v in {**env, "PYTHONPATH": str(ROOT)}.items() for a in ("-e", f"{k}={v}")]
    return [*argv[:cut], *handed, "--cwd", str(ROOT), "--", *TEST_SERVER, *server[3:]]


def test_the_readme_shows_the_command_the_docs_show() -> None:
    readme = commands((ROOT / "README.md").read_text())
    assert readme and all(command in DOCS for command in readme)
    assert all("--protocol-era" in c and "modern" in c for c in DOCS)


@pytest.mark.parametrize("transport", ["http", "stdio"])
def test_the_inspector_cli_lists_and_calls_dex_tools_on_the_newest_revision(
    transport: str, dex: Dex, env: dict[str, str], start_worker: Callable[..., Worker]
) -> None:
    start_worker()
    over_stdio = [c for c in DOCS if "--" in c]
    over_http = [c for c in DOCS if c not in over_stdio]
    assert over_stdio and len(over_http) == 2
    answers = []
    with _server(transport, env) as target:
        for command in over_http if transport == "http" else over_stdio:
            answers.append(run(as_tested(command, str(target), env), env))
    assert "guarded_write" in {t["name"] for t in answers[0]["tools"]}
    if transport == "stdio":
        return
    meta = answers[1]["_meta"]
    # Stamped on 2026-07-28 answers only: the Inspector spoke the newest revision.
    assert SERVER_INFO_META_KEY in meta
    assert meta[OUTCOME_META_KEY] == "executed"
    key = meta[IDEMPOTENCY_META_KEY]
    assert dex.client().get_call(key).status is CallStatus.SUCCEEDED
    assert len(lines(key, "start")) == 1
