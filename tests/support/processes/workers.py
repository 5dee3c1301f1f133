"""Celery workers a test starts and its fixture stops, one way for every test: the fixture
yields a `start` function, keeps each worker it started, and stops them all after the test,
whatever the test did in between. Also the MCP test apps' worker (tests/support/mcp/tools_app.py),
whose modules import `mcp` when it is started: the CrewAI tests run these fixtures in a
virtualenv without the `mcp` extra (the Makefile's .venv-crewai)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import ParamSpec, TypeVar

from devtools.processes import CeleryWorker

P = ParamSpec("P")
W = TypeVar("W", bound=CeleryWorker)


def each_stopped(start: Callable[P, W]) -> Iterator[Callable[P, W]]:
    """The body of a worker-starting fixture (`yield from each_stopped(start)`): yields `start`,
    keeping every worker it returns, and stops them all when the test is over."""
    workers: list[W] = []

    def tracked(*args: P.args, **kwargs: P.kwargs) -> W:
        worker = start(*args, **kwargs)
        workers.append(worker)
        return worker

    yield tracked
    for worker in workers:
        worker.stop()


def mcp_worker(
    env: dict[str, str], *, module: str = "tests.support.mcp.tools_app", concurrency: int = 2
) -> CeleryWorker:
    """A started worker of an MCP test app, logging into the test's own folder."""
    from devtools.mcp_tools_server import LOG_ENV
    from tests.support.mcp.tools_app import READY_ENV

    return CeleryWorker(
        module, env, Path(env[LOG_ENV]) / "worker", concurrency=concurrency, ready_env=READY_ENV
    ).start()
