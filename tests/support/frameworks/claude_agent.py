"""Running a Claude Agent SDK agent in the tests: the real `claude` CLI (npm
`@anthropic-ai/claude-code`, installed from tests/js/claude/package-lock.json by `make install`)
pointed at the scripted Messages API server (`dex_celery.testing.models.claude_messages`), with
its own HOME, so nothing leaves the machine. One `Desk` is one SDK session, resumed prompt after
prompt (`resume=`), as a chat app keeps a customer's conversation."""

from __future__ import annotations

import asyncio
import shutil
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest

from devtools.processes import ROOT

#: Where `make install` puts the CLI (`npm ci` in tests/js/claude).
CLI = ROOT / "tests" / "js" / "claude" / "node_modules" / ".bin" / "claude"


def claude_cli() -> Path:
    """The CLI; the calling test skips only when Node.js or npm is missing."""
    if shutil.which("node") is None or shutil.which("npm") is None:
        pytest.skip("Node.js and npm are needed for the Claude Code CLI the Claude Agent SDK runs")
    assert CLI.exists(), f"{CLI} is missing: run `make install` (npm ci in tests/js/claude)"
    return CLI


class Desk:
    """One Claude Agent SDK session whose dex tools run on the test's workers."""

    def __init__(
        self,
        dex: Any,
        model: Any,
        names: Sequence[str],
        home: Path,
        **options: Any,
    ) -> None:
        from dex_celery.integrations.frameworks.claude_agent import DexClaude

        self.cli = claude_cli()
        self.model = model
        self.home = home
        self.bridge = DexClaude(dex, names, **options)
        #: The SDK's session id, once the first prompt ran.
        self.sdk_session: str | None = None

    def ask(self, prompt: str) -> list[Any]:
        """One prompt of the session (resumed after the first); the SDK's messages."""
        return asyncio.run(self._ask(prompt))

    async def _ask(self, prompt: str) -> list[Any]:
        from claude_agent_sdk import ClaudeSDKClient

        self.home.mkdir(parents=True, exist_ok=True)
        options = self.bridge.options(
            cli_path=str(self.cli),
            cwd=str(self.home),
            env=self.model.env(self.home),
            resume=self.sdk_session,
        )
        out: list[Any] = []
        async with ClaudeSDKClient(options) as client:
            await client.query(prompt)
            async for message in client.receive_response():
                out.append(message)
                session = getattr(message, "session_id", None)
                if isinstance(session, str) and session:
                    self.sdk_session = session
        return out


def final_text(messages: Sequence[Any]) -> str:
    """The run's result text (the SDK's `ResultMessage`)."""
    from claude_agent_sdk import ResultMessage

    (result,) = [m for m in messages if isinstance(m, ResultMessage)]
    return str(result.result)
