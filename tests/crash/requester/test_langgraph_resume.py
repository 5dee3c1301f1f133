"""A LangGraph agent process SIGKILLed while its dex write runs on a worker, then resumed from
its checkpoint by a new process: LangGraph runs the tool node again from its start, and the
dex tool gets the same call back (same key, same record); the write runs once by the tool's
own side-effect log."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from devtools.processes import ROOT, Worker
from dex_celery import CallStatus, Dex
from tests.support.faults.crash import lines, release_tools, tool_messages, wait_started
from tests.support.frameworks.langgraph_agent import WRITE

pytestmark = pytest.mark.crash


def _agent(env: dict[str, str], checkpoint: Path, *extra: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "tests.support.frameworks.langgraph_agent", str(checkpoint), "thread-1", *extra],
        cwd=ROOT, env={**os.environ, **env}, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        text=True, start_new_session=True,
    )  # fmt: skip


def test_graph_resumed_from_its_checkpoint_after_a_crash_gets_the_same_call(
    dex: Dex, env: dict[str, str], start_worker: Callable[..., Worker], tmp_path: Path
) -> None:
    start_worker()
    checkpoint = tmp_path / "checkpoints.sqlite"
    key = f"thread-1/turn-1/{WRITE[2]}"

    first = _agent(env, checkpoint)
    try:
        wait_started(key)  # the write is running on the worker
    finally:
        os.killpg(first.pid, signal.SIGKILL)
        first.wait(timeout=10)
    assert dex.client().get_call(key).status is CallStatus.PENDING

    resumed = _agent(env, checkpoint, "--resume")
    release_tools(env)  # the first (and only) execution may now finish
    out, err = resumed.communicate(timeout=120)
    assert resumed.returncode == 0, err[-3000:]

    printed = [json.loads(line) for line in out.splitlines()]
    assert printed[-1] == {"final": "Done."}
    record = dex.client().get_call(key)
    assert record.status is CallStatus.SUCCEEDED
    assert printed[0] == {"id": WRITE[2], "content": tool_messages(dex, key)[0]}
    assert tool_messages(dex, key) == ['"once"']
    assert len(lines(key, "start")) == 1  # LangGraph re-ran the node; the write ran once
    assert [r.key for r in dex.client().get_agent_snapshot("thread-1").tool_calls] == [key]
