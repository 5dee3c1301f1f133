"""deploy/kubernetes/*.yaml, checked without a cluster (docs/deploy.md, "Kubernetes").

Each document is valid against the Kubernetes API's own schemas, strictly (an unknown or
misspelt field fails): `kubernetes-validate` from PyPI bundles them, so this runs offline, for
the oldest and newest API versions it knows. Every command the manifests run (containers,
probes, preStop hooks, each part of an `sh -c` line) exists: `celery` subcommands, remote-control
actions and options are looked up in `celery -A APP ... --help` / `--list` of the app the
manifests name, `dex-celery` commands in its click tree, `python -c` code compiles, anything
else is a program on this machine. And the deploy's promises: exactly one beat that is
recreated rather than rolled, workers that roll without losing capacity, stop consuming before
SIGTERM and have a grace period above the longest start-to-close of the app's tools (as do the
systemd unit and the compose file), health checks from the processes' own doors (the worker's
/readyz and /livez, beat's sweeps), the migration as a Job.
"""

from __future__ import annotations

import configparser
import functools
import os
import re
import shlex
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import click
import pytest
import yaml

from devtools.processes import ROOT
from dex_celery.cli.appfinder import find_dex
from dex_celery.cli.main import main
from tests.support.faults.crash import env_names

kubernetes_validate = pytest.importorskip("kubernetes_validate", reason="the dev extra")

MANIFESTS = ROOT / "deploy" / "kubernetes"
APP = "dex_celery.examples.orderdesk.app"
#: Above the longest start_to_close, at least this much for the preStop and the hand-back.
GRACE_MARGIN = 30
BIN = Path(sys.executable).parent


def documents() -> list[tuple[str, dict[str, Any]]]:
    found = []
    for path in sorted(MANIFESTS.glob("*.yaml")):
        for document in yaml.safe_load_all(path.read_text()):
            if document:
                found.append((path.name, document))
    return found


def _kind(kind: str, name: str) -> dict[str, Any]:
    (found,) = [d for _, d in documents() if d["kind"] == kind and d["metadata"]["name"] == name]
    return found


def _containers(document: dict[str, Any]) -> list[dict[str, Any]]:
    spec = document.get("spec", {}).get("template", {}).get("spec", {})
    return list(spec.get("containers", [])) + list(spec.get("initContainers", []))


def _commands(container: dict[str, Any]) -> Iterator[list[str]]:
    """Every command line the container runs: its own, its probes' and its hooks' `exec`."""
    own = [*container.get("command", []), *container.get("args", [])]
    if own:
        yield [str(w) for w in own]
    for probe in ("livenessProbe", "readinessProbe", "startupProbe"):
        if "exec" in container.get(probe, {}):
            yield [str(w) for w in container[probe]["exec"]["command"]]
    for hook in container.get("lifecycle", {}).values():
        if "exec" in hook:
            yield [str(w) for w in hook["exec"]["command"]]


def simple_commands(words: list[str]) -> list[list[str]]:
    """A command line as the programs it runs: `sh -c '...'` split at `;`, `&&`, `||`, with
    redirections dropped and `$HOSTNAME` standing for the pod's name."""
    if words[0] not in ("sh", "bash") or words[1:2] != ["-c"]:
        return [words]
    parts = re.split(r";|&&|\|\|", words[2])
    out = []
    for part in parts:
        split = [w for w in shlex.split(part) if not re.fullmatch(r"\d?>&?\S*|/dev/null", w)]
        if split:
            out.append([w.replace("$HOSTNAME", "pod-1") for w in split])
    return out


def all_commands() -> list[tuple[str, list[str]]]:
    return [
        (f"{name}: {document['metadata']['name']}/{container['name']}", simple)
        for name, document in documents()
        for container in _containers(document)
        for line in _commands(container)
        for simple in simple_commands(line)
    ]


@functools.cache
def _celery_help(*words: str) -> str:
    done = subprocess.run(
        [str(BIN / "celery"), "-A", APP, *words],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=ROOT,
        env={**os.environ, "DEX_REDIS_URL": "redis://127.0.0.1:1/0"},  # never dialled by --help
    )
    assert done.returncode == 0, (words, done.stderr[-2000:])
    return done.stdout


def _options(words: list[str]) -> list[str]:
    return [w.split("=", 1)[0] for w in words if w.startswith("-")]


def check_celery(words: list[str]) -> None:
    assert words[1] == "-A" and words[2] == APP, f"{words}: names no app (-A {APP})"
    subcommand, rest = words[3], words[4:]
    if subcommand in ("control", "inspect"):
        action = rest[0]
        listed = _celery_help(subcommand, "--list")
        assert re.search(rf"^\s+{re.escape(action)}\b", listed, re.MULTILINE), (
            f"celery {subcommand} has no action {action!r}"
        )
        text = _celery_help(subcommand, "--help")
    else:
        text = _celery_help(subcommand, "--help")
    for option in _options(rest):
        assert re.search(rf"(^|[\s,]){re.escape(option)}\b", text), (
            f"celery {subcommand} has no option {option}"
        )


def check_dex_celery(words: list[str]) -> None:
    rest = words[1:]
    if rest[:1] == ["-A"]:
        assert rest[1] == APP, words
        rest = rest[2:]
    else:
        assert rest[:1] == ["db"], f"{words}: names no app (-A {APP})"
    command: click.Command = main
    while isinstance(command, click.Group):
        assert rest and rest[0] in command.commands, f"{words}: no command {rest[:1]}"
        command, rest = command.commands[rest[0]], rest[1:]
    known = {o for p in command.params for o in (*p.opts, *p.secondary_opts)}
    for option in _options(rest):
        assert option in known, f"{words}: `{command.name}` has no option {option}"


def check_command(words: list[str]) -> None:
    program = words[0]
    if program == "celery":
        check_celery(words)
    elif program == "dex-celery":
        check_dex_celery(words)
    elif program == "python" and words[1] == "-c":
        compile(words[2], "<manifest>", "exec")
    else:
        assert shutil.which(program), f"no program {program!r}"


# --- the checks ----------------------------------------------------------------------------------


def test_the_manifests_are_there() -> None:
    kinds = {(d["kind"], d["metadata"]["name"]) for _, d in documents()}
    assert {
        ("Deployment", "dex-celery-worker"),
        ("Deployment", "dex-celery-beat"),
        ("Deployment", "dex-celery-web"),
        ("Service", "dex-celery-web"),
        ("Job", "dex-celery-migrate"),
        ("ConfigMap", "dex-celery"),
        ("PodDisruptionBudget", "dex-celery-worker"),
    } <= kinds


@pytest.mark.parametrize("version", ["1.25.0", kubernetes_validate.latest_version()])
def test_every_document_is_valid_against_the_api_schemas(version: str) -> None:
    errors = []
    for name, document in documents():
        try:
            kubernetes_validate.validate(document, version, strict=True)
        except kubernetes_validate.ValidationError as e:
            errors.append(f"{name} {document['kind']}: {e.message} at {list(e.path)}")
    assert errors == []


def test_the_schema_check_refuses_a_misspelt_field() -> None:
    worker = _kind("Deployment", "dex-celery-worker")
    spec = worker["spec"]["template"]["spec"]
    broken = {
        **worker,
        "spec": {
            **worker["spec"],
            "template": {**worker["spec"]["template"], "spec": {**spec, "terminationGrace": 1}},
        },
    }
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(broken, "1.25.0", strict=True)


def test_every_command_the_manifests_run_exists() -> None:
    commands = all_commands()
    programs = {words[0] for _, words in commands}
    assert {"celery", "dex-celery"} <= programs, programs
    for where, words in commands:
        try:
            check_command(words)
        except AssertionError as e:
            raise AssertionError(f"{where}: {shlex.join(words)}: {e}") from None


def test_the_command_check_catches_what_does_not_exist() -> None:
    for words in (
        ["celery", "-A", APP, "control", "stop_consuming", "celery"],
        ["celery", "-A", APP, "worker", "--prefetch-everything"],
        ["dex-celery", "db", "migrate"],
        ["dex-celery", "-A", APP, "web", "--listen", "0.0.0.0"],
        ["dex-celery", "web", "--port", "8000"],
        ["python", "-c", "import urllib.request; urllib.request.urlopen("],
        ["no-such-program-here"],
    ):
        with pytest.raises((AssertionError, SyntaxError)):
            check_command(words)


def test_exactly_one_beat_and_it_is_recreated_not_rolled() -> None:
    beats = [
        (name, document)
        for name, document in documents()
        for container in _containers(document)
        if "beat" in container.get("command", [])
    ]
    assert len(beats) == 1, beats
    _, beat = beats[0]
    assert beat["kind"] == "Deployment"
    assert beat["spec"]["replicas"] == 1
    assert beat["spec"]["strategy"] == {"type": "Recreate"}


def _longest_start_to_close() -> float:
    dex = find_dex(APP)
    return max(
        tool.policy.start_to_close or dex.settings.start_to_close for tool in dex.tools.values()
    )


def test_workers_roll_without_losing_capacity_and_outlast_their_longest_tool() -> None:
    worker = _kind("Deployment", "dex-celery-worker")
    assert worker["spec"]["strategy"]["rollingUpdate"]["maxUnavailable"] == 0
    pod = worker["spec"]["template"]["spec"]
    grace = pod["terminationGracePeriodSeconds"]
    assert grace >= _longest_start_to_close() + GRACE_MARGIN
    (container,) = pod["containers"]
    assert "readinessProbe" in container and "livenessProbe" in container
    # The compose file and the systemd unit give a warm shutdown the same time or more.
    compose = yaml.safe_load((ROOT / "docker-compose.yml").read_text())["services"]["worker"]
    assert compose["stop_grace_period"] == f"{grace}s"
    unit = configparser.RawConfigParser(strict=False, interpolation=None)
    unit.read(ROOT / "config" / "systemd" / "dex-celery-worker.service")
    assert int(unit["Service"]["TimeoutStopSec"]) >= grace


def test_the_pre_stop_hook_stops_every_queue_the_worker_consumes() -> None:
    (container,) = _containers(_kind("Deployment", "dex-celery-worker"))
    command = container["command"]
    queues = set(command[command.index("-Q") + 1].split(","))
    hook = simple_commands(container["lifecycle"]["preStop"]["exec"]["command"])
    cancelled = set()
    for words in hook:
        assert words[:5] == ["celery", "-A", APP, "control", "cancel_consumer"], words
        assert words[words.index("-d") + 1] == "celery@pod-1"  # this pod's node only
        cancelled.add(words[5])
    assert cancelled == queues
    # ... and it runs the compose file's worker command.
    compose = yaml.safe_load((ROOT / "docker-compose.yml").read_text())["services"]["worker"]
    assert command == compose["command"]


def test_the_probes_ask_the_processes_own_doors() -> None:
    """Worker: started and alive while its main loop ticks (/livez), ready while its database,
    Redis and broker answer it (/readyz), all on its own door, on the port its environment
    opens (docs/operations.md, "Probes"); beat: alive while its sweeper sweeps; web: /healthz
    with a Host it answers."""
    (worker,) = _containers(_kind("Deployment", "dex-celery-worker"))
    port = next(e["value"] for e in worker["env"] if e["name"] == "DEX_WORKER_METRICS_PORT")
    (named,) = [p for p in worker["ports"] if p["name"] == "metrics"]
    assert str(named["containerPort"]) == port
    paths = {"startupProbe": "/livez", "readinessProbe": "/readyz", "livenessProbe": "/livez"}
    for probe, path in paths.items():
        assert worker[probe]["httpGet"] == {"path": path, "port": "metrics"}, probe
    (beat,) = _containers(_kind("Deployment", "dex-celery-beat"))
    assert beat["livenessProbe"]["exec"]["command"] == [
        "dex-celery", "-A", APP, "probe", "live", "--beat",
    ]  # fmt: skip
    (web,) = _containers(_kind("Deployment", "dex-celery-web"))
    for probe in ("readinessProbe", "livenessProbe"):
        check = web[probe]["httpGet"]
        assert check["path"] == "/healthz"
        assert {"name": "Host", "value": "localhost"} in check["httpHeaders"]


def test_the_migration_is_a_job_that_upgrades_the_schema() -> None:
    job = _kind("Job", "dex-celery-migrate")
    (container,) = _containers(job)
    assert container["command"] == ["dex-celery", "db", "upgrade"]
    assert job["spec"]["template"]["spec"]["restartPolicy"] == "Never"


def test_every_dex_variable_is_a_setting() -> None:
    known = env_names()
    config = _kind("ConfigMap", "dex-celery")
    named = set(config["data"])
    for _, document in documents():
        for container in _containers(document):
            named |= {e["name"] for e in container.get("env", []) if e["name"].startswith("DEX_")}
            refs = [
                r["configMapRef"]["name"]
                for r in container.get("envFrom", [])
                if "configMapRef" in r
            ]
            assert refs == ["dex-celery"], refs
    assert named <= known, named - known
