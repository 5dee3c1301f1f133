"""The shipped process definitions restart a worker (and beat) whose main process exits (issue
19, "Workers come back"; docs/operations.md): docker-compose.yml's restart policies and the
systemd units in deploy/systemd/. `dex-celery dev` has its own test
(tests/integration/processes/test_dev_supervisor.py).
"""

from __future__ import annotations

import configparser
import importlib
import shlex
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml
from celery import Celery

from devtools.processes import ROOT
from dex_celery import Dex

COMPOSE = ROOT / "docker-compose.yml"
UNITS = ROOT / "deploy" / "systemd"
#: Restart policies of docker compose that start an exited container again.
RESTARTING = ("always", "unless-stopped", "on-failure")


def _unit(name: str) -> configparser.RawConfigParser:
    parser = configparser.RawConfigParser(strict=False, interpolation=None)
    parser.optionxform = str  # type: ignore[assignment,method-assign]  # keys are case-sensitive
    parser.read(UNITS / name)
    return parser


def _compose_services() -> dict[str, dict[str, Any]]:
    return dict(yaml.safe_load(COMPOSE.read_text())["services"])


@pytest.mark.parametrize("name", ["worker", "beat", "flower", "web"])
def test_compose_restarts_every_long_running_dex_service(name: str) -> None:
    service = _compose_services()[name]
    assert service.get("restart") in RESTARTING, f"{name}: restart is {service.get('restart')!r}"


def test_compose_never_restarts_the_one_shot_migration() -> None:
    assert _compose_services()["migrate"].get("restart") == "no"


@pytest.mark.parametrize(
    ("unit", "subcommand"),
    [("dex-celery-worker.service", "worker"), ("dex-celery-beat.service", "beat")],
)
def test_the_systemd_units_restart_always_and_run_the_app(unit: str, subcommand: str) -> None:
    parser = _unit(unit)
    service = parser["Service"]
    assert service["Restart"] == "always"
    assert float(service["RestartSec"]) > 0  # a bounded pause, not a hot loop
    assert parser["Unit"]["StartLimitIntervalSec"] == "0"  # systemd never gives up
    args = shlex.split(service["ExecStart"])
    assert Path(args[0]).name == "celery"
    assert args[args.index("-A") + 1] == "dex_celery.examples.orderdesk.app"
    assert subcommand in args
    module = importlib.import_module(args[args.index("-A") + 1])
    assert isinstance(module.app, Celery) and isinstance(module.dex, Dex)
    assert service["EnvironmentFile"].startswith("/etc/")


def test_the_worker_unit_runs_what_compose_runs() -> None:
    """The same pool, concurrency and queues as the compose file's worker."""
    unit = shlex.split(_unit("dex-celery-worker.service")["Service"]["ExecStart"])
    composed = [str(a) for a in _compose_services()["worker"]["command"]]
    assert unit[1 : 1 + len(composed) - 1] == composed[1:]


@pytest.mark.skipif(shutil.which("systemd-analyze") is None, reason="no systemd-analyze")
def test_systemd_accepts_the_units(tmp_path: Path) -> None:
    """`systemd-analyze verify` finds nothing wrong but the install path of this machine."""
    celery = Path(sys.executable).parent / "celery"
    for unit in UNITS.glob("*.service"):
        text = unit.read_text().replace("/opt/dex-celery/.venv/bin/celery", str(celery))
        (tmp_path / unit.name).write_text(text)
    result = subprocess.run(
        ["systemd-analyze", "verify", *sorted(str(p) for p in tmp_path.glob("*.service"))],
        capture_output=True,
        text=True,
        timeout=60,
    )
    problems = [
        line
        for line in (result.stdout + result.stderr).splitlines()
        if line.strip() and "/opt/dex-celery" not in line and "/etc/dex-celery" not in line
    ]
    assert problems == [], problems


def test_the_operations_page_shows_the_units_and_the_restart_policies() -> None:
    page = (ROOT / "docs" / "operations.md").read_text()
    for unit in UNITS.glob("*.service"):
        assert f"deploy/systemd/{unit.name}" in page
    assert "Restart=always" in page
    assert "restart: unless-stopped" in page
    assert "dex-celery -A APP dev" in page
