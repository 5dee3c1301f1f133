"""docker-compose.yml, checked without a Docker engine (S9.1, S9.2).

Every command names a module and app that really import, every `DEX_*` variable is one the
settings read, Redis persists, Flower asks for a password, every long-running service has a
health check, and the README documents the same command lines.
"""

from __future__ import annotations

import importlib
import shlex
from dataclasses import fields
from typing import Any

import click
import pytest
import yaml
from celery import Celery

from devtools.processes import ROOT
from dex_celery import Dex
from dex_celery.cli.appfinder import find_dex
from dex_celery.cli.main import main
from dex_celery.processes.celery_config import configure_celery, is_amqp_url
from dex_celery.settings import Settings, env_name
from tests.support.faults.crash import env_names

COMPOSE = ROOT / "docker-compose.yml"
LONG_RUNNING = ("redis", "postgres", "worker", "beat", "flower")


@pytest.fixture(scope="module")
def services() -> dict[str, dict[str, Any]]:
    document = yaml.safe_load(COMPOSE.read_text())
    return dict(document["services"])


def command_of(service: dict[str, Any]) -> list[str]:
    command = service.get("command", [])
    return shlex.split(command) if isinstance(command, str) else [str(c) for c in command]


def option(args: list[str], *names: str) -> str | None:
    for i, arg in enumerate(args):
        for name in names:
            if arg == name and i + 1 < len(args):
                return args[i + 1]
            if arg.startswith(name + "="):
                return arg.split("=", 1)[1]
    return None


def test_the_stack_has_every_service_with_health_checks(services: dict[str, Any]) -> None:
    """S9.1: Redis, PostgreSQL, a worker, beat and Flower; each reports its health."""
    assert set(LONG_RUNNING) <= set(services)
    for name in LONG_RUNNING:
        check = services[name].get("healthcheck", {})
        assert check.get("test"), f"{name} has no health check"


def test_redis_persists_its_data(services: dict[str, Any]) -> None:
    """S9.1: Redis with persistence (the broker's messages and the ledger)."""
    args = command_of(services["redis"])
    assert args[0] == "redis-server"
    assert option(args, "--appendonly") == "yes"
    assert any(v.endswith(":/data") for v in services["redis"].get("volumes", []))


def test_every_celery_command_names_an_app_that_imports(services: dict[str, Any]) -> None:
    """Each `celery -A <module>` imports and exposes the Celery app and its Dex; the worker is
    prefork and consumes every queue the app routes a tool to."""
    seen = set()
    for name, service in services.items():
        args = command_of(service)
        if not args or args[0] != "celery":
            continue
        module_name = option(args, "-A", "--app")
        assert module_name, f"{name}: no -A"
        module = importlib.import_module(module_name)
        assert isinstance(module.app, Celery), f"{name}: {module_name}.app is not a Celery app"
        assert isinstance(module.dex, Dex)
        subcommand = next(a for a in args[1:] if not a.startswith("-") and a != module_name)
        seen.add(subcommand)
        if subcommand == "worker":
            assert option(args, "-P", "--pool") == "prefork"
            queues = set((option(args, "-Q", "--queues") or "").split(","))
            routes = module.app.conf.task_routes or {}
            routed = {r["queue"] for r in routes.values()} | {module.app.conf.task_default_queue}
            assert routed <= queues, f"queues nobody consumes: {routed - queues}"
    assert seen == {"worker", "beat", "flower"}


def test_dex_celery_commands_exist(services: dict[str, Any]) -> None:
    """`dex-celery db upgrade` (the migrate service) is a real command, and `-A dex_celery.examples.orderdesk.app`
    (the compose file's app, as for celery) finds its Dex."""
    found = False
    for service in services.values():
        args = command_of(service)
        if not args or args[0] != "dex-celery":
            continue
        found = True
        words = args[1:]
        if words[:1] == ["-A"]:
            assert words[1] == "dex_celery.examples.orderdesk.app", args
            words = words[2:]
        elif words[:1] != ["db"]:
            # No default app: `dex-celery web` alone fails with "no app given" (issue 24).
            raise AssertionError(f"{args}: names no app (-A dex_celery.examples.orderdesk.app)")
        command: click.Command = main
        for word in words:
            if not isinstance(command, click.Group) or word.startswith("-"):
                break  # the rest are the command's own arguments
            assert word in command.commands, f"{args}: no command {word!r}"
            command = command.commands[word]
        assert not isinstance(command, click.Group), f"{args} names a group, not a command"
    assert found
    assert isinstance(find_dex("dex_celery.examples.orderdesk.app"), Dex)


def test_every_dex_variable_is_a_setting(services: dict[str, Any]) -> None:
    """Every `DEX_*` variable the file sets is read by `Settings.from_env()` (no typos that
    would silently fall back to a default)."""
    known = env_names()
    set_somewhere = set()
    for name, service in services.items():
        environment = service.get("environment") or {}
        if isinstance(environment, list):
            environment = dict(item.split("=", 1) for item in environment)
        for variable in environment:
            if variable.startswith("DEX_"):
                assert variable in known, f"{name} sets {variable}, which no setting reads"
                set_somewhere.add(variable)
    assert {"DEX_REDIS_URL", "DEX_DATABASE_URL"} <= set_somewhere


def test_services_run_the_one_image_and_the_schema_is_migrated_first(
    services: dict[str, Any],
) -> None:
    """Worker, beat, Flower and the migration share one image built from the Dockerfile; the
    worker and beat start only after `dex-celery db upgrade` finished."""
    images = {services[n]["image"] for n in ("worker", "beat", "flower", "migrate")}
    assert len(images) == 1
    assert services["worker"].get("build") == "." and (ROOT / "Dockerfile").exists()
    for name in ("worker", "beat"):
        depends = services[name]["depends_on"]
        assert depends["migrate"]["condition"] == "service_completed_successfully"
    dockerfile = (ROOT / "Dockerfile").read_text()
    for package in ("dex_celery",):
        assert f"COPY {package} " in dockerfile


def test_flower_requires_basic_auth_from_the_environment(services: dict[str, Any]) -> None:
    """S9.2: Flower shows task arguments; it is never open without a password, and the
    password comes from the environment, not from the file."""
    value = str(services["flower"]["environment"]["FLOWER_BASIC_AUTH"])
    assert value.startswith("${FLOWER_BASIC_AUTH:?"), value


def test_the_readme_documents_the_same_commands(services: dict[str, Any]) -> None:
    """The README's production section shows the exact command lines the file runs."""
    readme = (ROOT / "README.md").read_text()
    for name in ("worker", "beat", "flower", "migrate"):
        line = shlex.join(command_of(services[name]))
        assert line in readme, f"README lacks the {name} command: {line}"
    assert "docker compose up" in readme


def test_the_readme_lists_every_setting_with_its_default() -> None:
    """Every field of `Settings` has a row: name, environment variable and the real default."""
    readme = (ROOT / "README.md").read_text()
    for field in fields(Settings):
        default = "none" if field.default is None else str(field.default)
        row = f"| `{field.name}` | `{env_name(field.name)}` | "
        assert row in readme, f"README's settings table lacks {field.name}"
        cell = readme.split(row, 1)[1].split(" |", 1)[0]
        assert cell.strip("`").startswith(default), f"{field.name}: README says {cell}"


# --- the RabbitMQ variant (docker-compose.rabbitmq.yml, docs/rabbitmq.md) ---------------------

RABBITMQ_COMPOSE = ROOT / "docker-compose.rabbitmq.yml"
RABBITMQ_CONF = ROOT / "deploy" / "rabbitmq.conf"
#: The services that reach the broker: each gets the RabbitMQ URL and waits for RabbitMQ.
BROKER_CLIENTS = ("worker", "beat", "flower", "web")


def _merged(base: dict[str, Any], override: dict[str, Any]) -> dict[str, Any]:
    """Compose's merge of an override file, for the keys these files use: mappings
    (environment, depends_on) merge key by key, everything else is replaced."""
    out = dict(base)
    for key, value in override.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = {**out[key], **value}
        else:
            out[key] = value
    return out


@pytest.fixture(scope="module")
def rabbit_services(services: dict[str, Any]) -> dict[str, dict[str, Any]]:
    override = yaml.safe_load(RABBITMQ_COMPOSE.read_text())["services"]
    merged = dict(services)
    for name, service in override.items():
        merged[name] = _merged(merged.get(name, {}), service)
    return merged


def _rabbit_conf() -> dict[str, str]:
    pairs = {}
    for line in RABBITMQ_CONF.read_text().splitlines():
        if line.strip() and not line.lstrip().startswith("#"):
            key, value = line.split("=", 1)
            pairs[key.strip()] = value.strip()
    return pairs


def test_the_rabbitmq_variant_runs_a_persistent_checked_rabbitmq(
    rabbit_services: dict[str, Any],
) -> None:
    """RabbitMQ with its data on a volume under a fixed host name (the node's data folder is
    named after it), a health check, and dex-celery's settings file mounted."""
    rabbit = rabbit_services["rabbitmq"]
    assert str(rabbit["image"]).startswith("rabbitmq:")
    assert rabbit["hostname"] == "rabbitmq"
    assert rabbit["healthcheck"]["test"]
    volumes = rabbit["volumes"]
    assert any(v.endswith(":/var/lib/rabbitmq") for v in volumes)
    assert "./deploy/rabbitmq.conf:/etc/rabbitmq/conf.d/20-dex-celery.conf:ro" in volumes
    assert rabbit["environment"]["RABBITMQ_DEFAULT_VHOST"] == "dex"


def test_every_broker_client_uses_rabbitmq_and_redis_stays_the_ledger(
    rabbit_services: dict[str, Any],
) -> None:
    """Worker, beat, Flower and the web app get an `amqp://` broker URL in the vhost RabbitMQ
    creates, wait for RabbitMQ to be healthy, and keep Redis as the ledger; the settings they
    make give the app quorum queues and publisher confirms."""
    known = env_names()
    for name in BROKER_CLIENTS:
        service = rabbit_services[name]
        environment = service["environment"]
        url = str(environment["DEX_BROKER_URL"])
        assert is_amqp_url(url) and url.endswith("@rabbitmq:5672/dex"), url
        assert environment["DEX_REDIS_URL"] == "redis://redis:6379/0"
        assert set(v for v in environment if v.startswith("DEX_")) <= known
        assert service["depends_on"]["rabbitmq"]["condition"] == "service_healthy"
        assert "redis" in service["depends_on"]  # the ledger
    app = Celery("compose-rabbit")
    configure_celery(app, Settings(broker_url="amqp://dex:dex@rabbitmq:5672/dex"))
    assert app.conf.task_default_queue_type == "quorum"
    assert app.conf.broker_transport_options["confirm_publish"] is True


def test_the_rabbitmq_consumer_timeout_outlasts_every_tool_of_the_app() -> None:
    """`consumer_timeout` (ms) in the mounted settings is above the longest start-to-close of
    the compose app's tools, so no attempt within its deadline loses its channel; new queues
    default to quorum."""
    conf = _rabbit_conf()
    dex = find_dex("dex_celery.examples.orderdesk.app")
    longest = max(
        tool.policy.start_to_close or dex.settings.start_to_close for tool in dex.tools.values()
    )
    assert int(conf["consumer_timeout"]) / 1000 > longest
    assert conf["default_queue_type"] == "quorum"


def test_the_readme_shows_the_rabbitmq_variant() -> None:
    readme = (ROOT / "README.md").read_text()
    assert "docker compose -f docker-compose.yml -f docker-compose.rabbitmq.yml up -d --build" in (
        readme
    )
