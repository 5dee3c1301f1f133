"""docs/deploy.md's commands, run as written where they can run here.

Every shell line of the page is either run here or is one this machine cannot run (`sudo`,
`kubectl`: no systemd service, no cluster; their manifests and units have their own tests,
tests/integration/deploy/test_kubernetes_manifests.py and test_process_definitions.py). The rest run,
in the page's order, against a real stack of the reference app (`dex_celery.examples.orderdesk.app`): a private
redis-server, a fresh PostgreSQL database, and a prefork worker started with the compose file's
command line, so `celery@$(hostname)` is its node name. Each must end with exit code 0 and do
what the page says: the migration reaches the newest revision while the worker runs, the ping is
answered by that worker, its door answers the probes (`dex-celery probe`), `cancel_consumer` stops its consumption of each queue, the grace
one-liner prints what the page says it prints, `status` reports the schema.
"""

from __future__ import annotations

import contextlib
import os
import re
import shlex
import signal
import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

from devtools.processes import ROOT, RedisServer, free_port, wait_for
from dex_celery.store import migrate
from tests.support.docs.readme import reader_env
from tests.support.stores.pg_database import fresh_database

pytestmark = pytest.mark.postgres

PAGE = ROOT / "docs" / "deploy.md"
BLOCK = re.compile(r"```(\w+)\n(.*?)```", re.DOTALL)
#: Programs of the page that need what this machine has not: systemd, a Kubernetes cluster.
ELSEWHERE = {"sudo", "kubectl"}
#: Programs of the page run here.
RUN_HERE = {"dex-celery", "celery", "python"}


def shell_lines() -> list[str]:
    lines = []
    for language, body in BLOCK.findall(PAGE.read_text()):
        if language == "sh":
            lines += [ln.strip() for ln in body.splitlines() if ln.strip()]
    return lines


def test_every_line_is_run_here_or_needs_systemd_or_a_cluster() -> None:
    programs = {shlex.split(line)[0] for line in shell_lines()}
    assert programs <= ELSEWHERE | RUN_HERE, programs - ELSEWHERE - RUN_HERE
    assert programs >= RUN_HERE


@pytest.fixture
def stack(redis_server: RedisServer, tmp_path: Path) -> Iterator[dict[str, str]]:
    """The reference app's environment, with its worker running (the compose file's command,
    one process)."""
    redis.Redis.from_url(redis_server.url).flushall()
    env = reader_env(
        DEX_REDIS_URL=redis_server.url,
        DEX_KEY_PREFIX=f"t{uuid.uuid4().hex[:8]}",
        # The worker's door, which the probes ask (a free port here).
        DEX_WORKER_METRICS_PORT=str(free_port()),
    )
    with fresh_database("dex_docs_deploy") as database:
        env["DEX_DATABASE_URL"] = database
        migrate.upgrade(database)  # a worker does not start without its schema (the Job's step)
        log = tmp_path / "worker.log"
        command = "celery -A dex_celery.examples.orderdesk.app worker -P prefork -c 4 -Q celery,labels -l info"
        with log.open("wb") as out:
            worker = subprocess.Popen(
                [*shlex.split(command.replace("-c 4", "-c 1")), "--without-mingle"],
                cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True,
            )  # fmt: skip
        try:
            wait_for(
                lambda: " ready." in log.read_text() or worker.poll() is not None,
                timeout=90,
                what="the reference app's worker to be ready",
            )
            assert worker.poll() is None, log.read_text()[-3000:]
            yield env
        finally:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(worker.pid, signal.SIGKILL)
            worker.wait(timeout=10)


def test_the_deploy_commands_run_as_written(stack: dict[str, str]) -> None:
    ran: list[str] = []
    for line in dict.fromkeys(shell_lines()):  # a line the page repeats runs once
        if shlex.split(line)[0] in ELSEWHERE:
            continue
        done = subprocess.run(
            ["bash", "-c", line], cwd=ROOT, env=stack, capture_output=True, text=True, timeout=120
        )
        assert done.returncode == 0, (line, done.stdout[-2000:], done.stderr[-2000:])
        assert "Traceback" not in done.stderr, (line, done.stderr[-3000:])
        words = shlex.split(line)
        if words[1:3] == ["db", "upgrade"]:
            assert migrate.current(stack["DEX_DATABASE_URL"]) == migrate.head()
        if "ping" in words:
            assert "pong" in done.stdout, done.stdout
        if "cancel_consumer" in words:
            queue = words[words.index("cancel_consumer") + 1]
            assert f"no longer consuming from {queue}\n" in done.stdout, done.stdout
        if words[0] == "python" and "find_dex" in line:  # the grace one-liner
            assert f"prints `{done.stdout.strip()}`" in PAGE.read_text(), done.stdout
        if "probe" in words:  # the worker's door (on this test's free port) or the backends
            assert done.stdout.startswith(("ready (", "ok: the main loop ticked")), done.stdout
        if "status" in words:
            assert f"schema at revision {migrate.head()} (newest)" in done.stdout, done.stdout
        ran.append(" ".join(words[:4]))
    assert len(ran) >= 8, ran
