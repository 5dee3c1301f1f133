"""`dex-celery mcp` for the MCP tests to connect to: over stdio, or a running HTTP server."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import tempfile
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import IO, Any

from mcp import StdioServerParameters

from devtools.processes import ROOT, free_port, wait_for
from dex_celery.processes.parent_death import popen_with_parent_death

#: The console script of the interpreter running the tests, whatever its virtual environment.
DEX_CELERY = str(Path(sys.executable).parent / "dex-celery")


APP = ["--app", "devtools.toolapp:dex", "mcp"]


def _text(result: Any) -> str:
    return "\n".join(block.text for block in result.content)


@contextmanager
def _server(transport: str, env: dict[str, str], app: list[str] | None = None) -> Iterator[Any]:
    """What `Client(...)` connects to: the stdio command, or the URL of a running HTTP server
    (of `app`, `--app MODULE:dex`, the test tools' by default)."""
    full_env = {**env, "PYTHONPATH": str(ROOT)}
    command = [*(app or APP[:2]), "mcp"]
    if transport == "stdio":
        yield StdioServerParameters(
            command=DEX_CELERY, args=[*command, "--wait-timeout", "60"], env=full_env, cwd=str(ROOT)
        )
        return
    with served_over_http(command, full_env) as url:
        yield url


@contextmanager
def served_over_http(command: Sequence[str], env: Mapping[str, str]) -> Iterator[str]:
    """`dex-celery COMMAND --transport http --port PORT` (a free port) running: its URL. A
    failing test's error gets the server's stderr."""
    port = free_port()
    # A file, not a pipe nobody reads: a server that logs much must never block on stderr.
    with tempfile.TemporaryFile() as errors:
        process = popen_with_parent_death(
            [DEX_CELERY, *command, "--transport", "http", "--port", str(port)],
            cwd=ROOT,
            env={**os.environ, **env},
            stdout=subprocess.DEVNULL,
            stderr=errors,
        )
        try:
            wait_for(
                lambda: _listening(port) or process.poll() is not None,
                timeout=30,
                what="dex-celery mcp to listen",
            )
            assert process.poll() is None, _read(errors)
            try:
                yield f"http://127.0.0.1:{port}/mcp"
            except BaseException as e:  # a failing test shows what the server said
                e.add_note(f"dex-celery mcp's stderr:\n{_read(errors)[-3000:]}")
                raise
        finally:
            process.kill()
            process.wait(timeout=10)


def _read(file: IO[bytes]) -> str:
    file.seek(0)
    return file.read().decode(errors="replace")


def _listening(port: int) -> bool:
    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) == 0
