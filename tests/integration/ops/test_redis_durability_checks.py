"""Startup checks of Redis's persistence configuration, against real redis-server processes of
each configuration: one warning when claims could be lost, a refusal with
`DEX_REQUIRE_DURABLE_REDIS=1`, one line (never a crash) when CONFIG is forbidden."""

from __future__ import annotations

import logging
import os
import subprocess
import sys
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

import pytest
import redis

from devtools.processes import ROOT, CeleryBeat, RedisServer, Worker, free_port
from dex_celery import Dex
from dex_celery.ledger.health import UnsafeRedis, Verdict, assess, check, check_at_start
from dex_celery.store.repository import Store

#: Each configuration, and what the check must say about it.
CONFIGURATIONS: list[tuple[str, bool, str, Sequence[str], Verdict, str]] = [
    ("snapshots only", False, "everysec", (), Verdict.AT_RISK, "appendonly is no"),
    ("aof always", True, "always", (), Verdict.DURABLE, ""),
    ("aof everysec", True, "everysec", (), Verdict.AT_RISK, "appendfsync is everysec"),
    ("aof no fsync", True, "no", (), Verdict.AT_RISK, "appendfsync is no"),
    (
        "evicting",
        True,
        "always",
        ("--maxmemory", "64mb", "--maxmemory-policy", "allkeys-lru"),
        Verdict.AT_RISK,
        "maxmemory-policy is allkeys-lru",
    ),
    (
        "volatile eviction",
        True,
        "always",
        ("--maxmemory", "64mb", "--maxmemory-policy", "volatile-lru"),
        Verdict.DURABLE,
        "",
    ),
    (
        "allkeys without a memory limit",
        True,
        "always",
        ("--maxmemory", "0", "--maxmemory-policy", "allkeys-lru"),
        Verdict.DURABLE,
        "",
    ),
]
#: A managed Redis: CONFIG renamed away.
NO_CONFIG = ("--rename-command", "CONFIG", "")


@pytest.fixture
def redis_factory(tmp_path: Path) -> Iterator[Callable[..., RedisServer]]:
    servers: list[RedisServer] = []

    def start(
        appendonly: bool = False, appendfsync: str = "everysec", extra: Sequence[str] = ()
    ) -> RedisServer:
        server = RedisServer(
            tmp_path / f"redis-{len(servers)}",
            appendonly=appendonly,
            appendfsync=appendfsync,
            extra_args=tuple(extra),
        ).start()
        servers.append(server)
        return server

    yield start
    for server in servers:
        server.kill()


@pytest.mark.parametrize(
    ("name", "appendonly", "fsync", "extra", "verdict", "says"),
    CONFIGURATIONS,
    ids=[c[0] for c in CONFIGURATIONS],
)
def test_each_configuration_is_judged_from_the_real_server(
    redis_factory: Callable[..., RedisServer],
    name: str,
    appendonly: bool,
    fsync: str,
    extra: Sequence[str],
    verdict: Verdict,
    says: str,
) -> None:
    server = redis_factory(appendonly, fsync, extra)
    report = check(redis.Redis.from_url(server.url, decode_responses=True))
    assert report.verdict is verdict, report
    if says:
        assert any(says in risk for risk in report.risks), report.risks
    else:
        assert report.risks == ()


def test_everysec_is_accepted_when_replicas_hold_each_claim() -> None:
    config = {"appendonly": "yes", "appendfsync": "everysec", "maxmemory-policy": "noeviction"}
    assert assess(config).verdict is Verdict.AT_RISK
    assert assess(config, claim_replicas=1).verdict is Verdict.DURABLE
    # No AOF stays a risk whatever the replicas: a restart of the primary forgets the claims.
    assert assess({**config, "appendonly": "no"}, claim_replicas=2).verdict is Verdict.AT_RISK


def test_one_warning_line_and_a_refusal_when_required(
    redis_factory: Callable[..., RedisServer], caplog: pytest.LogCaptureFixture
) -> None:
    server = redis_factory()  # no AOF
    client = redis.Redis.from_url(server.url, decode_responses=True)
    with caplog.at_level(logging.INFO, logger="dex_celery.ops.status"):
        check_at_start(client, where=server.url, require=False, claim_replicas=0, component="w")
    (line,) = [r for r in caplog.records if r.name == "dex_celery.ops.status"]
    assert line.levelno == logging.WARNING
    assert "can lose acknowledged claims" in line.getMessage()
    assert "DEX_REQUIRE_DURABLE_REDIS=1" in line.getMessage()
    with pytest.raises(UnsafeRedis, match="does not start"):
        check_at_start(client, where=server.url, require=True, claim_replicas=0, component="w")


def test_a_redis_that_forbids_config_gets_one_line_never_a_crash(
    redis_factory: Callable[..., RedisServer], caplog: pytest.LogCaptureFixture
) -> None:
    server = redis_factory(True, "always", NO_CONFIG)
    client = redis.Redis.from_url(server.url, decode_responses=True)
    with caplog.at_level(logging.INFO, logger="dex_celery.ops.status"):
        report = check_at_start(
            client, where=server.url, require=False, claim_replicas=0, component="w"
        )
    assert report.verdict is Verdict.UNCHECKED
    (line,) = [r for r in caplog.records if r.name == "dex_celery.ops.status"]
    assert "could not check" in line.getMessage() and "CONFIG GET was refused" in line.getMessage()
    with pytest.raises(UnsafeRedis):
        check_at_start(client, where=server.url, require=True, claim_replicas=0, component="w")


# --- the processes: worker and `dex-celery sweep` ---------------------------------------------


def _worker_env(env: dict[str, str], server: RedisServer, **more: str) -> dict[str, str]:
    return {**env, "DEX_REDIS_URL": server.url, **more}


def test_worker_warns_once_and_starts_or_refuses_when_required(
    dex: Dex, env: dict[str, str], redis_factory: Callable[..., RedisServer], tmp_path: Path
) -> None:
    server = redis_factory()  # snapshots only: claims can be lost
    worker = Worker(_worker_env(env, server), Path(env["DEX_TEST_TOOL_LOG"]), 1).start()
    try:
        warnings = [x for x in worker.log().splitlines() if "can lose acknowledged claims" in x]
        assert len(warnings) == 1, worker.log()[-3000:]
        assert "worker:" in warnings[0]
    finally:
        worker.stop()

    refusing = Worker(
        _worker_env(env, server, DEX_REQUIRE_DURABLE_REDIS="1"), tmp_path / "refusing", 1
    )
    with pytest.raises(RuntimeError, match="worker exited at start"):
        refusing.start(timeout=60)
    assert refusing.process is not None and refusing.process.returncode == 1
    assert "does not start" in refusing.log()
    assert "Traceback" not in refusing.log()


def test_worker_on_a_redis_without_config_starts_with_one_line(
    dex: Dex, env: dict[str, str], redis_factory: Callable[..., RedisServer]
) -> None:
    server = redis_factory(True, "always", NO_CONFIG)
    worker = Worker(_worker_env(env, server), Path(env["DEX_TEST_TOOL_LOG"]), 1).start()
    try:
        lines = [x for x in worker.log().splitlines() if "could not check" in x]
        assert len(lines) == 1, worker.log()[-3000:]
        assert "Traceback" not in worker.log()
    finally:
        worker.stop()


def _sweep_cli(
    env: dict[str, str], server: RedisServer, **more: str
) -> subprocess.CompletedProcess[str]:
    # Each Redis here is a deployment of its own, so it gets a database of its own (one
    # database belongs to one ledger: docs/ledger.md).
    if server.directory.exists():
        database = f"sqlite:///{server.directory / 'dex.db'}"
        Store(database).create_schema()
        more = {"DEX_DATABASE_URL": database, **more}
    return subprocess.run(
        [
            str(Path(sys.executable).parent / "dex-celery"),
            "--app",
            "devtools.toolapp:dex",
            "sweep",
        ],
        cwd=ROOT,
        env={**os.environ, **_worker_env(env, server, **more)},
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_the_sweep_command_warns_or_refuses_with_one_error_line(
    dex: Dex, env: dict[str, str], redis_factory: Callable[..., RedisServer]
) -> None:
    risky = redis_factory()
    warned = _sweep_cli(env, risky)
    assert warned.returncode == 0, warned.stderr
    assert warned.stderr.count("can lose acknowledged claims") == 1, warned.stderr

    refused = _sweep_cli(env, risky, DEX_REQUIRE_DURABLE_REDIS="1")
    assert refused.returncode == 1
    (line,) = refused.stderr.strip().splitlines()
    assert line.startswith("error: sweep: Redis at ") and "does not start" in line

    durable = redis_factory(True, "always")
    quiet = _sweep_cli(env, durable, DEX_REQUIRE_DURABLE_REDIS="1")
    assert quiet.returncode == 0, quiet.stderr
    assert "claims" not in quiet.stderr

    managed = redis_factory(True, "always", NO_CONFIG)
    unchecked = _sweep_cli(env, managed)
    assert unchecked.returncode == 0, unchecked.stderr
    assert unchecked.stderr.count("could not check") == 1
    assert "Traceback" not in unchecked.stderr


def test_beat_warns_or_refuses_before_it_starts_its_sweeper(
    dex: Dex, env: dict[str, str], redis_factory: Callable[..., RedisServer], tmp_path: Path
) -> None:
    risky = redis_factory()
    beat = CeleryBeat("devtools.toolapp", _worker_env(env, risky), tmp_path / "beat").start()
    try:
        assert beat.log().count("can lose acknowledged claims") == 1
    finally:
        beat.stop()

    refusing = CeleryBeat(
        "devtools.toolapp",
        _worker_env(env, risky, DEX_REQUIRE_DURABLE_REDIS="1"),
        tmp_path / "refusing-beat",
    )
    with pytest.raises(RuntimeError, match="beat exited at start"):
        refusing.start(timeout=60)
    assert refusing.process is not None and refusing.process.returncode == 1
    assert "beat: Redis at" in refusing.log() and "does not start" in refusing.log()
    assert "the dex sweeper runs" not in refusing.log()


def test_the_sweep_command_on_an_unreachable_redis_prints_one_error_line(
    dex: Dex, env: dict[str, str]
) -> None:
    gone = RedisServer(Path("/nonexistent"), port=free_port())  # never started
    result = _sweep_cli(env, gone)
    assert result.returncode == 1
    (line,) = result.stderr.strip().splitlines()
    assert line.startswith("error: sweep: cannot reach Redis at ")
