"""Processes whose host clock is wrong: the clock shim (`clock_skew/sitecustomize.py`) put first
on a child's `PYTHONPATH`, a sweeper (`dex-celery sweep --loop`) and a requester run that way.

    python -m tests.support.faults.skew request '<json list of [session, turn, call, tool, args]>'

requests the calls through the client of `devtools.toolapp` in one turn each, then prints
one JSON line: this process's `time.time()` and the keys requested.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from devtools import toolapp
from devtools.processes import ROOT
from dex_celery import CallRequest
from dex_celery.processes.parent_death import popen_with_parent_death

SHIM_DIR = Path(__file__).resolve().parent / "clock_skew"
SKEW_ENV = "DEX_TEST_CLOCK_SKEW"
DEX_SCRIPT = Path(sys.executable).parent / "dex-celery"


def skewed(env: Mapping[str, str], seconds: float) -> dict[str, str]:
    """`env` for a child process whose wall clock is `seconds` ahead (negative: behind)."""
    path = [str(SHIM_DIR), *filter(None, [env.get("PYTHONPATH", os.environ.get("PYTHONPATH"))])]
    return {**env, "PYTHONPATH": os.pathsep.join(path), SKEW_ENV: repr(float(seconds))}


def _child_env(env: Mapping[str, str]) -> dict[str, str]:
    return {**os.environ, **env}


@dataclass
class SweeperProcess:
    """`dex-celery --app devtools.toolapp:dex sweep --loop` in its own process."""

    env: Mapping[str, str]
    logfile: Path
    process: subprocess.Popen[bytes] | None = None

    def start(self) -> SweeperProcess:
        args = [str(DEX_SCRIPT), "--app", "devtools.toolapp:dex", "sweep", "--loop"]
        with self.logfile.open("ab") as out:
            self.process = popen_with_parent_death(
                args,
                cwd=ROOT,
                env=_child_env(self.env),
                stdout=out,
                stderr=subprocess.STDOUT,
            )
        return self

    def stop(self) -> None:
        if self.process is None:
            return
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.process.wait(timeout=10)
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait(timeout=10)
        self.process = None

    def alive(self) -> bool:
        return self.process is not None and self.process.poll() is None


@dataclass(frozen=True)
class Requested:
    """What a requester process reported: its own wall clock when done, and the keys."""

    host_time: float
    keys: list[str]


def request_in_child(
    env: Mapping[str, str], calls: list[tuple[str, str, str, str, dict[str, Any]]]
) -> Requested:
    """Request `calls` from a separate process started with `env`; wait for it to finish."""
    proc = subprocess.run(
        [sys.executable, "-m", "tests.support.faults.skew", "request", json.dumps(calls)],
        cwd=ROOT,
        env=_child_env(env),
        capture_output=True,
        text=True,
        timeout=60,
    )
    if proc.returncode != 0:
        raise AssertionError(f"requester failed:\n{proc.stdout[-2000:]}\n{proc.stderr[-3000:]}")
    reply = json.loads(proc.stdout.strip().splitlines()[-1])
    return Requested(float(reply["time"]), list(reply["keys"]))


def _request(raw: str) -> None:
    client = toolapp.dex.client()
    keys = []
    for session, turn, call, tool, arguments in json.loads(raw):
        record = client.request_calls([CallRequest(session, turn, call, tool, arguments)])[0]
        keys.append(record.key)
    print(json.dumps({"time": time.time(), "keys": keys}), flush=True)


if __name__ == "__main__":
    if sys.argv[1:2] != ["request"] or len(sys.argv) != 3:
        raise SystemExit(
            "usage: python -m tests.support.faults.skew request '<json list of calls>'"
        )
    _request(sys.argv[2])
