"""A real Flower process on the test tools' app, for the tests that read what Flower shows."""

from __future__ import annotations

import base64
import contextlib
import json
import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from devtools.processes import ROOT, free_port, wait_for
from dex_celery import Dex
from dex_celery.processes.parent_death import popen_with_parent_death


class Flower:
    """A Flower process in its own process group, with basic auth."""

    def __init__(self, env: dict[str, str], logfile: Path) -> None:
        self.port = free_port()
        self.auth = ("ops", uuid.uuid4().hex)
        args = [
            sys.executable,
            "-m",
            "celery",
            "-A",
            "devtools.toolapp",
            "flower",
            "--address=127.0.0.1",
            f"--port={self.port}",
            f"--broker={env['DEX_REDIS_URL']}",
            f"--basic-auth={self.auth[0]}:{self.auth[1]}",
        ]
        with logfile.open("wb") as out:
            self.process = popen_with_parent_death(
                args,
                cwd=ROOT,
                env={**os.environ, **env},
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        self.logfile = logfile

    def get(self, path: str, *, auth: bool = True) -> tuple[int, str]:
        request = urllib.request.Request(f"http://127.0.0.1:{self.port}{path}")
        if auth:
            token = base64.b64encode(":".join(self.auth).encode()).decode()
            request.add_header("Authorization", f"Basic {token}")
        try:
            with urllib.request.urlopen(request, timeout=5) as response:
                return response.status, response.read().decode()
        except urllib.error.HTTPError as e:
            return e.code, e.read().decode(errors="replace")

    def up(self) -> bool:
        if self.process.poll() is not None:
            raise AssertionError(f"flower exited:\n{self.logfile.read_text()[-3000:]}")
        with contextlib.suppress(OSError):
            return self.get("/healthcheck", auth=False) == (200, "OK")
        return False

    def tasks(self) -> dict[str, Any]:
        status, body = self.get("/api/tasks")
        assert status == 200, body
        return dict(json.loads(body))

    def stop(self) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.process.pid, signal.SIGKILL)
        self.process.wait(timeout=10)


@pytest.fixture
def flower(env: dict[str, str], tmp_path: Path) -> Iterator[Flower]:
    process = Flower(env, tmp_path / "flower.log")
    try:
        wait_for(process.up, timeout=60, what="Flower to answer /healthcheck")
        yield process
    finally:
        process.stop()


def _wait_until_flower_receives_events(dex: Dex, flower: Flower) -> None:
    """Flower only knows the tasks whose events it received; its event receiver connects in the
    background after the HTTP server is up. Probe with real calls until one shows."""
    client = dex.client()
    probes = iter(range(1, 1000))

    def a_probe_shows() -> bool:
        key = client.request_call("probe", "t1", f"c{next(probes)}", "echo", {}).key
        client.wait([key], timeout=30)
        deadline = time.monotonic() + 3
        while time.monotonic() < deadline:
            if f"{key}#1" in flower.tasks():
                return True
            time.sleep(0.2)
        return False

    wait_for(a_probe_shows, timeout=60, what="Flower to receive task events", interval=0)
