"""The README's "RabbitMQ as the broker" commands, executed as written on the machine's RabbitMQ
(docs/rabbitmq.md).

Only the names change: the vhost and user `dex` become names of this test (deleted at the end)
and the ledger's Redis and the database are the test's own. The worker the README starts must
connect to RabbitMQ, switch to per-consumer prefetch (quorum queues refuse a global QoS) and
declare every queue it consumes as a quorum queue: redeclaring one as classic is refused.
"""

from __future__ import annotations

import contextlib
import os
import re
import shlex
import signal
import subprocess
import sys
import uuid
from pathlib import Path

import amqp
import pytest

from devtools.processes import ROOT, RedisServer, wait_for
from tests.support.faults.rabbitmq import amqp_url, rabbitmqctl, shared_server_missing

BLOCK = re.compile(r"```sh\n(.*?)```", re.DOTALL)


def section_commands() -> list[str]:
    text = (ROOT / "README.md").read_text()
    start = text.index("\n### RabbitMQ as the broker")
    end = text.index("\n## ", start + 1)
    first = BLOCK.findall(text[start:end])[0]
    lines = [line.split("  #")[0].strip() for line in first.splitlines()]
    return [line for line in lines if line]


def _is_quorum(url: str, queue: str) -> bool:
    """Declaring `queue` as classic is refused when it exists as a quorum queue."""
    rest = url.split("@", 1)[1]
    hostport, _, vhost = rest.partition("/")
    user, password = url.split("://", 1)[1].split("@", 1)[0].split(":", 1)
    connection = amqp.Connection(hostport, userid=user, password=password, virtual_host=vhost)
    connection.connect()
    try:
        channel = connection.channel()
        channel.queue_declare(queue, durable=True, auto_delete=False)
    except amqp.exceptions.PreconditionFailed as refused:
        return "x-queue-type" in str(refused)
    finally:
        with contextlib.suppress(Exception):
            connection.close()
    return False


def test_the_readme_rabbitmq_commands_run_a_worker_on_quorum_queues(
    redis_server: RedisServer, tmp_path: Path
) -> None:
    missing = shared_server_missing()
    if missing:
        pytest.skip(f"RabbitMQ README commands not run: {missing}")
    name = f"dex-readme-{uuid.uuid4().hex[:8]}"
    own = {
        "DEX_REDIS_URL": redis_server.url,
        "DEX_DATABASE_URL": f"sqlite:///{tmp_path / 'dex.db'}",
    }
    env = {k: v for k, v in os.environ.items() if not k.startswith("DEX_")}
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    env["DEX_DATABASE_URL"] = own["DEX_DATABASE_URL"]
    worker: subprocess.Popen[bytes] | None = None
    log = tmp_path / "worker.log"
    try:
        for command in section_commands():
            words = [re.sub(r"\bdex\b(?!-)", name, w) for w in shlex.split(command)]
            if words[0] == "export":
                variable, _, value = words[1].partition("=")
                env[variable] = own.get(variable, value)
            elif words[0] == "rabbitmqctl":
                words[0] = str(rabbitmqctl())
                done = subprocess.run(words, capture_output=True, text=True, timeout=120)
                assert done.returncode == 0, (command, done.stdout, done.stderr)
            elif words[0] == "dex-celery":
                done = subprocess.run(
                    words, cwd=ROOT, env=env, capture_output=True, text=True, timeout=120
                )
                assert done.returncode == 0, (command, done.stdout, done.stderr)
            elif words[0] == "celery":
                with log.open("wb") as out:
                    worker = subprocess.Popen(
                        words, cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT,
                        start_new_session=True,
                    )  # fmt: skip
            else:
                raise AssertionError(f"unexpected command in the README section: {command}")
        assert worker is not None, "the section starts a worker"
        broker = env["DEX_BROKER_URL"]
        assert broker == amqp_url(name).replace("guest:guest", f"{name}:change-me")
        wait_for(
            lambda: " ready." in log.read_text() or worker.poll() is not None,
            timeout=120,
            what="the README's worker to be ready on RabbitMQ",
        )
        text = log.read_text()
        assert worker.poll() is None, text[-3000:]
        assert f"Connected to amqp://{name}:**@127.0.0.1:5672/{name}" in text
        assert "Global QoS is disabled" in text
        queues = shlex.split(section_commands()[-1])
        consumed = queues[queues.index("-Q") + 1].split(",")
        for queue in consumed:
            assert _is_quorum(broker, queue), f"{queue} is not a quorum queue"
    finally:
        if worker is not None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(worker.pid, signal.SIGKILL)
            worker.wait(timeout=10)
        ctl = rabbitmqctl()
        if ctl:
            subprocess.run([ctl, "delete_vhost", name], capture_output=True, timeout=120)
            subprocess.run([ctl, "delete_user", name], capture_output=True, timeout=120)
