"""The shipped alert rules, dashboard, scrape configuration and manifests agree with each other
(docs/deploy.md, "Kubernetes"; docs/operations.md, "Alerts" and "Probes").

deploy/ is read as one reference deployment: deploy/kubernetes/*.yaml, deploy/prometheus/
(alerts.yml and prometheus.yml), deploy/grafana/*.json and docker-compose.yml. Checked:

- every series an alert or a panel reads is one dex-celery serves (the collector itself, run
  against a real private Redis and SQLite) or Prometheus's `up` of a job the scrape
  configuration has;
- every scrape job reaches a door of a workload: a headless Service of that port selecting the
  pods, a container port of that number, a door that listens beyond loopback on it (the pod's
  address, so the `Host` Prometheus sends passes) and serves `metrics_path`, with the token
  Prometheus sends coming from a Secret the pods read and the deploy page makes;
- every workload has a PodDisruptionBudget and CPU and memory requests and limits;
- every probe runs a command that exists (exec) or asks a path its door serves (httpGet), in
  the manifests and in the compose file's health checks; beat's checks its sweeps, not a file;
- `promtool check config` accepts the scrape configuration (its syntax: the token file is the
  cluster's).
"""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import subprocess
from typing import Any

import pytest
import yaml

from devtools.processes import ROOT
from dex_celery import Dex
from dex_celery.ops.metrics import registry_for
from dex_celery.processes.health import LIVE_PATH, READY_PATH
from tests.integration.deploy.test_kubernetes_manifests import (
    check_command,
    documents,
    simple_commands,
)

PROMETHEUS = ROOT / "deploy" / "prometheus"
SCRAPE = PROMETHEUS / "prometheus.yml"
DASHBOARDS = sorted((ROOT / "deploy" / "grafana").glob("*.json"))
COMPOSE = ROOT / "docker-compose.yml"
DEPLOY_PAGE = ROOT / "docs" / "deploy.md"
#: The paths each kind of door serves: the worker's own port, and the web app.
WORKER_DOOR_PATHS = {"/metrics", READY_PATH, LIVE_PATH}
WEB_DOOR_PATHS = {"/metrics", "/healthz"}
#: A series in PromQL: `dex_...` names, and `up{job="..."}`.
SERIES = re.compile(r"\b(dex_[a-z0-9_]+)\b")
UP_JOB = re.compile(r'\bup\{[^}]*job="([^"]+)"')


def _alert_exprs() -> dict[str, str]:
    groups = yaml.safe_load((PROMETHEUS / "alerts.yml").read_text())["groups"]
    return {rule["alert"]: rule["expr"] for group in groups for rule in group["rules"]}


def _dashboard_exprs() -> list[str]:
    found: list[str] = []

    def walk(node: Any) -> None:
        if isinstance(node, dict):
            for key, value in node.items():
                if key == "expr" and isinstance(value, str):
                    found.append(value)
                else:
                    walk(value)
        elif isinstance(node, list):
            for item in node:
                walk(item)

    for path in DASHBOARDS:
        walk(json.loads(path.read_text()))
    return found


def _scrape_jobs() -> dict[str, dict[str, Any]]:
    config = yaml.safe_load(SCRAPE.read_text())
    return {job["job_name"]: job for job in config["scrape_configs"]}


def _of_kind(kind: str) -> list[dict[str, Any]]:
    return [d for _, d in documents() if d["kind"] == kind]


def _pod_spec(workload: dict[str, Any]) -> dict[str, Any]:
    spec: dict[str, Any] = workload["spec"]["template"]["spec"]
    return spec


def _selects(selector: dict[str, str], labels: dict[str, str]) -> bool:
    return all(labels.get(k) == v for k, v in selector.items())


def _env_value(container: dict[str, Any], name: str) -> dict[str, Any] | None:
    return next((e for e in container.get("env", []) if e["name"] == name), None)


def _option(words: list[str], name: str) -> str | None:
    return words[words.index(name) + 1] if name in words else None


def _door(container: dict[str, Any]) -> tuple[int, str, set[str], str] | None:
    """(port, where it listens, the paths it serves, the Secret of its token setting) of the
    container's dex-celery door: a worker's own port or the web app; None for neither."""
    command = [str(w) for w in container.get("command", [])]
    if "worker" in command:
        port_env = _env_value(container, "DEX_WORKER_METRICS_PORT")
        if port_env is None:
            return None
        host_env = _env_value(container, "DEX_WORKER_METRICS_HOST") or {"value": "127.0.0.1"}
        host = str(host_env.get("value", ""))
        if host_env.get("valueFrom", {}).get("fieldRef", {}).get("fieldPath") == "status.podIP":
            host = "<pod address>"
        return int(port_env["value"]), host, WORKER_DOOR_PATHS, "dex-celery-metrics"
    if command[:1] == ["dex-celery"] and "web" in command:
        port, host = _option(command, "--port"), _option(command, "--host") or "127.0.0.1"
        if host == "$(POD_IP)":
            pod_ip = _env_value(container, "POD_IP") or {}
            if pod_ip.get("valueFrom", {}).get("fieldRef", {}).get("fieldPath") == "status.podIP":
                host = "<pod address>"
        return int(port or 8000), host, WEB_DOOR_PATHS, "dex-celery-web"
    return None


def _secrets_read(container: dict[str, Any]) -> set[str]:
    return {r["secretRef"]["name"] for r in container.get("envFrom", []) if "secretRef" in r}


def _secrets_made_with(setting: str) -> set[str]:
    """The Secrets docs/deploy.md's `kubectl create secret` lines make holding `setting`."""
    made = set()
    for line in DEPLOY_PAGE.read_text().splitlines():
        words = shlex.split(line) if line.startswith("kubectl create secret") else []
        if any(w.startswith(f"--from-literal={setting}=") for w in words):
            made.add(words[4])
    return made


def _door_of_job(job: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any], str]:
    """The Deployment, container and door host a scrape job reaches, asserting each link."""
    (sd,) = job["dns_sd_configs"]
    (name,) = sd["names"]
    service_name, port = name.split(".")[0], int(sd["port"])
    assert sd.get("type", "SRV") == "A", f"{job['job_name']}: an A lookup lists pod addresses"
    services = [s for s in _of_kind("Service") if s["metadata"]["name"] == service_name]
    assert len(services) == 1, f"{job['job_name']}: no Service {service_name} in the manifests"
    service = services[0]
    assert service["spec"].get("clusterIP") == "None", f"{service_name} is not headless"
    (service_port,) = [p for p in service["spec"]["ports"] if p["port"] == port]
    selector = service["spec"]["selector"]
    (workload,) = [
        w
        for w in _of_kind("Deployment")
        if _selects(selector, w["spec"]["template"]["metadata"]["labels"])
    ]
    for container in _pod_spec(workload)["containers"]:
        named = {p["name"]: p["containerPort"] for p in container.get("ports", [])}
        target = service_port.get("targetPort", port)
        if named.get(target, target) != port:
            continue
        door = _door(container)
        assert door is not None, f"{job['job_name']}: port {port} is no dex-celery door"
        door_port, host, paths, secret = door
        assert door_port == port, f"{job['job_name']}: the door listens on {door_port}"
        assert host == "<pod address>", (
            f"{job['job_name']}: the door listens on {host}, which Prometheus cannot reach "
            "or whose Host check refuses the pod's address"
        )
        assert job.get("metrics_path", "/metrics") in paths
        assert "authorization" in job, f"{job['job_name']}: a door beyond loopback wants a token"
        assert secret in _secrets_read(container), f"the pods do not read the Secret {secret}"
        assert secret in _secrets_made_with("DEX_WEB_TOKENS"), (
            f"docs/deploy.md makes no Secret {secret} holding DEX_WEB_TOKENS"
        )
        return workload, container, host
    raise AssertionError(f"{job['job_name']}: no container port {port} behind {service_name}")


@pytest.fixture
def served(dex: Dex) -> set[str]:
    """The series names dex-celery's collector serves (after one sweep, so the sweep's too)."""
    dex.sweeper.sweep_once()
    names = set()
    for family in registry_for(dex).collect():
        # A counter family is named without `_total`; its samples (when it has any) carry it.
        names.add(f"{family.name}_total" if family.type == "counter" else family.name)
        names |= {sample.name for sample in family.samples}
    return names


def test_every_series_an_alert_or_panel_reads_is_served_and_scraped(served: set[str]) -> None:
    jobs = _scrape_jobs()
    reached = {name: _door_of_job(job) for name, job in jobs.items()}
    exprs = {f"alert {a}": e for a, e in _alert_exprs().items()}
    exprs |= {f"panel {i}": e for i, e in enumerate(_dashboard_exprs())}
    assert any(e.startswith("alert") for e in exprs) and any(e.startswith("panel") for e in exprs)
    for where, expr in exprs.items():
        for series in SERIES.findall(expr):
            assert series in served, f"{where}: dex-celery serves no series {series}"
        for job in UP_JOB.findall(expr):
            assert job in reached, f"{where}: no scrape job {job!r} in {SCRAPE.name}"
    # DexWorkerDown's `up` is the workers' own doors, one target per worker pod.
    (worker_job,) = UP_JOB.findall(_alert_exprs()["DexWorkerDown"])
    workload, _container, _host = reached[worker_job]
    assert workload["metadata"]["name"] == "dex-celery-worker"


def test_every_workload_has_a_disruption_budget_and_resource_limits() -> None:
    budgets = _of_kind("PodDisruptionBudget")
    for workload in _of_kind("Deployment") + _of_kind("Job"):
        name = workload["metadata"]["name"]
        labels = workload["spec"]["template"]["metadata"]["labels"]
        if workload["kind"] == "Deployment":
            covering = [
                b for b in budgets if _selects(b["spec"]["selector"]["matchLabels"], labels)
            ]
            assert len(covering) == 1, f"{name}: {len(covering)} PodDisruptionBudgets"
        for container in _pod_spec(workload)["containers"]:
            resources = container.get("resources", {})
            for part in ("requests", "limits"):
                assert {"cpu", "memory"} <= set(resources.get(part, {})), (
                    f"{name}/{container['name']}: no cpu and memory {part}"
                )


def _probes(container: dict[str, Any]) -> list[dict[str, Any]]:
    return [
        container[p] for p in ("startupProbe", "readinessProbe", "livenessProbe") if p in container
    ]


def test_every_probe_runs_a_command_that_exists_or_asks_a_path_its_door_serves() -> None:
    asked = 0
    for workload in _of_kind("Deployment"):
        for container in _pod_spec(workload)["containers"]:
            door = _door(container)
            named = {p["name"]: p["containerPort"] for p in container.get("ports", [])}
            probes = _probes(container)
            assert probes, f"{workload['metadata']['name']}: no probe"
            for probe in probes:
                asked += 1
                if "exec" in probe:
                    for words in simple_commands([str(w) for w in probe["exec"]["command"]]):
                        check_command(words)
                    continue
                check = probe["httpGet"]
                assert door is not None, f"{workload['metadata']['name']}: no door to ask"
                assert named.get(check["port"], check["port"]) == door[0]
                assert check["path"] in door[2], check
    assert asked >= 6


def test_beat_is_judged_by_its_sweeps_not_a_file() -> None:
    (beat,) = [w for w in _of_kind("Deployment") if w["metadata"]["name"] == "dex-celery-beat"]
    (container,) = _pod_spec(beat)["containers"]
    compose = yaml.safe_load(COMPOSE.read_text())["services"]["beat"]["healthcheck"]["test"]
    for words in (container["livenessProbe"]["exec"]["command"], compose[1:]):
        assert words[-3:] == ["probe", "live", "--beat"], words


def test_the_compose_health_checks_run_commands_that_exist() -> None:
    services = yaml.safe_load(COMPOSE.read_text())["services"]
    checked = 0
    for service in services.values():
        test = service.get("healthcheck", {}).get("test")
        if not test or service.get("image", "").startswith(("redis:", "postgres:", "rabbitmq")):
            continue  # those images' own tools
        words = [str(w) for w in test[1:]]
        lines = simple_commands(["sh", "-c", words[0]]) if test[0] == "CMD-SHELL" else [words]
        for line in lines:
            check_command(line)
            checked += 1
    assert checked >= 4, checked


def test_promtool_accepts_the_scrape_configuration() -> None:
    found = shutil.which("promtool")
    if found is None:
        if os.environ.get("CI", "").lower() == "true":
            pytest.fail("promtool is missing in CI: install Debian's `prometheus` package")
        pytest.skip("promtool is not installed (Debian package `prometheus`)")
    done = subprocess.run(
        [found, "check", "config", "--syntax-only", str(SCRAPE)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    rules = yaml.safe_load(SCRAPE.read_text())["rule_files"]
    assert rules == ["alerts.yml"] and (PROMETHEUS / rules[0]).is_file()
