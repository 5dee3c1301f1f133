"""`dex-celery` as a Celery user expects it (issue: installs into someone else's project).

Run as a person runs it: the installed `dex-celery` script in a subprocess, from a folder of the
test's own. Every failure is one `error:` line and exit code 1 with nothing changed; `-A/--app`
takes what `celery -A` takes, before or after the subcommand; read-only commands create nothing.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from celery import Celery

from devtools.pg_schema import postgres_schema
from devtools.processes import Worker, free_port
from devtools.toolapp import make_app
from dex_celery import CallStatus, Dex, RedisUnavailable, Settings
from dex_celery.cli.appfinder import find_dex
from dex_celery.engine.attempt.owners import parse_owner
from dex_celery.errors import AppNotFound, BackendUnavailable, DatabaseUnavailable, SchemaMissing
from tests.support.apps import cliapp
from tests.support.faults.crash import count_calls
from tests.support.processes.cli_run import APP, dead_redis, one_error_line, run


@pytest.fixture
def waiting(dex: Dex) -> str:
    """A call waiting for approval, recorded in the test's database (Redis up)."""
    return dex.client().request_call("s1", "t1", "c1", "guarded_write", {"value": 1}).key


def test_version_names_dex_celery_and_celery(env: dict[str, str]) -> None:
    result = run("--version", env={})
    assert result.returncode == 0
    assert result.stdout.startswith("dex-celery ") and "celery 5." in result.stdout


@pytest.mark.parametrize(
    ("case", "overrides", "args", "says"),
    [
        ("database URL not a URL", {"DEX_DATABASE_URL": "notaurl"}, ("calls", "list"), "notaurl"),
        ("Redis URL http", {"DEX_REDIS_URL": "http://127.0.0.1:6379/"}, ("calls", "list"), "redis"),
        (
            "missing database driver",
            {"DEX_DATABASE_URL": "postgresql+psycopg2://u@127.0.0.1:1/x"},
            ("calls", "list"),
            "driver",
        ),
        (
            "database down",
            {"DEX_DATABASE_URL": f"postgresql+psycopg://u@127.0.0.1:{free_port()}/x"},
            ("calls", "list"),
            "cannot use the database",
        ),
        ("Redis down: sweep", {"DEX_REDIS_URL": "dead"}, ("sweep",), "redis at"),
        ("no such app module", {}, ("-A", "no_such_project.celery", "calls", "list"), "import"),
    ],
)
def test_failures_are_one_error_line_and_exit_1(
    dex: Dex,
    env: dict[str, str],
    tmp_path: Path,
    case: str,
    overrides: dict[str, str],
    args: tuple[str, ...],
    says: str,
) -> None:
    overrides = {k: dead_redis() if v == "dead" else v for k, v in overrides.items()}
    folder = tmp_path / "cwd"
    folder.mkdir()
    before = count_calls(dex)
    result = run("-A", APP, *args, env={**env, **overrides}, cwd=folder)
    assert says in one_error_line(result).lower(), case
    assert count_calls(dex) == before
    assert list(folder.iterdir()) == []


def test_redis_down_approve_is_one_line_and_changes_nothing(
    dex: Dex, env: dict[str, str], waiting: str
) -> None:
    result = run(
        "-A", APP, "approvals", "approve", waiting, "--by", "ops",
        env={**env, "DEX_REDIS_URL": dead_redis()},
    )  # fmt: skip
    assert "redis" in one_error_line(result).lower()
    record = dex.client().get_call(waiting)
    assert record.status is CallStatus.AWAITING_APPROVAL and record.approval is None


def test_a_database_without_the_schema_is_one_line(env: dict[str, str], tmp_path: Path) -> None:
    """An existing database that was never migrated: named, with the command that fixes it."""
    url = f"sqlite:///{tmp_path / 'empty.db'}"
    make_app(Settings(database_url=url, redis_url=env["DEX_REDIS_URL"]))[
        1
    ].store.engine.connect().close()
    for args in (("approvals", "list"), ("calls", "list"), ("calls", "show", "s/t/c")):
        line = one_error_line(run("-A", APP, *args, env={**env, "DEX_DATABASE_URL": url}))
        assert f"dex-celery -A {APP} db upgrade" in line, args


def test_read_only_commands_create_nothing(env: dict[str, str], tmp_path: Path) -> None:
    """With the default database URL (a file in the current folder) and no such file, reading
    commands say so and leave the folder empty, instead of creating an empty database."""
    folder = tmp_path / "elsewhere"
    folder.mkdir()
    environ = {k: v for k, v in env.items() if k != "DEX_DATABASE_URL"}
    for args in (
        ("calls", "list"),
        ("calls", "show", "s/t/c"),
        ("approvals", "list"),
        ("db", "current"),
    ):
        line = one_error_line(run("-A", APP, *args, env=environ, cwd=folder))
        # Either way the line names the missing file: "does not exist", or (no database setting
        # at all) "no database configured: ... there is no <file>".
        assert "does not exist" in line or "there is no" in line, args
        assert "dex-celery.db" in line, args
    assert list(folder.iterdir()) == []


def test_no_app_is_a_hint_never_the_bundled_example(tmp_path: Path) -> None:
    line = one_error_line(run("calls", "list", env={}, cwd=tmp_path))
    assert "-A/--app" in line and "DEX_APP" in line
    assert list(tmp_path.iterdir()) == []


def test_app_accepts_module_celery_app_or_dex_before_or_after_the_subcommand(
    dex: Dex, env: dict[str, str]
) -> None:
    """As `celery -A`: a module, `module:celery_app` or `module:dex`; before or after."""
    dex.client().request_call("s1", "t1", "c1", "echo", {"n": 1})
    for app in (APP, f"{APP}:app", f"{APP}:dex"):
        for args in (
            ("-A", app, "calls", "list", "--json"),
            ("calls", "list", "--json", "-A", app),
        ):
            result = run(*args, env=env)
            assert result.returncode == 0, (args, result.stderr)
            assert [c["key"] for c in json.loads(result.stdout)] == ["s1/t1/c1"]
    result = run("calls", "list", "--app", APP, env={**env, "DEX_APP": "no_such_module"})
    assert result.returncode == 0, result.stderr  # the later option wins, as in Celery


def test_find_dex_finds_the_dex_bound_to_a_celery_app(
    env: dict[str, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """`-A proj.celery:app` names the host's Celery app; the Dex created on it is used. A
    Celery app without one is a one-line refusal naming the fix."""
    app = Celery("host_project")
    monkeypatch.setattr(cliapp, "host_app", app, raising=False)
    with pytest.raises(AppNotFound, match=r"Dex\(app\)"):
        find_dex("tests.support.apps.cliapp:host_app")
    dex = Dex(app, Settings.from_env(env))
    assert find_dex("tests.support.apps.cliapp:host_app") is dex
    with pytest.raises(AppNotFound, match="does not name"):
        find_dex("os:sep")


def test_calls_list_newest_first_with_since_and_pages_in_utc(dex: Dex, env: dict[str, str]) -> None:
    client = dex.client()
    keys = []
    for n in range(5):
        keys.append(client.request_call("s1", "t1", f"c{n}", "echo", {"n": n}).key)
        time.sleep(0.01)  # distinct request times, so the order is the request order
    first = run("-A", APP, "calls", "list", "--limit", "2", env=env)
    assert first.returncode == 0, first.stderr
    lines = first.stdout.splitlines()
    assert [line.split()[0] for line in lines[2:4]] == [keys[4], keys[3]]
    assert all(" UTC" in line for line in lines[2:4])
    cursor = lines[-1].split("--before ", 1)[1].split()[0]
    second = run("-A", APP, "calls", "list", "--limit", "2", "--before", cursor, "--json", env=env)
    assert [c["key"] for c in json.loads(second.stdout)] == [keys[2], keys[1]]
    recent = run("-A", APP, "calls", "list", "--since", "1h", "--json", env=env)
    assert len(json.loads(recent.stdout)) == 5
    future = run("-A", APP, "calls", "list", "--since", "2999-01-01", "--json", env=env)
    assert json.loads(future.stdout) == []
    bad = run("-A", APP, "calls", "list", "--since", "yesterday-ish", env=env)
    assert "--since" in one_error_line(bad)
    shown = run("-A", APP, "calls", "show", keys[0], env=env)
    requested = next(line for line in shown.stdout.splitlines() if line.startswith("requested"))
    assert requested.endswith(" UTC")


def test_the_client_raises_dex_celery_errors_when_redis_is_down(
    env: dict[str, str], dex: Dex
) -> None:
    _app, down = make_app(Settings.from_env({**env, "DEX_REDIS_URL": dead_redis()}))
    with pytest.raises(RedisUnavailable) as raised:
        down.client().request_call("s1", "t1", "c1", "echo", {})
    assert isinstance(raised.value, BackendUnavailable)


def test_calls_show_has_each_attempts_error_and_the_workers_node_name(
    dex: Dex, env: dict[str, str], start_worker: Callable[..., Worker]
) -> None:
    """The owner starts with `<Celery node name>:<pid>`, the name Flower and `celery inspect`
    show (then where that pid counts: engine/attempt/owners.py)."""
    start_worker(concurrency=1)
    client = dex.client()
    failing = client.request_call("s1", "t1", "bad", "failing", {"message": "no order 9"}).key
    flaky = client.request_call("s1", "t1", "flaky", "flaky_read", {"fail_times": 1}).key
    client.wait([failing, flaky], timeout=30)
    shown = json.loads(run("-A", APP, "calls", "show", failing, "--json", env=env).stdout)
    (attempt,) = shown["attempt_log"]
    assert "no order 9" in attempt["error"]
    assert attempt["node"].startswith("w") and "@" in attempt["node"]
    assert attempt["owner"].startswith(f"{attempt['node']}:{attempt['pid']}:")
    assert parse_owner(attempt["owner"]).node == attempt["node"]
    shown = json.loads(run("-A", APP, "calls", "show", flaky, "--json", env=env).stdout)
    first, second = shown["attempt_log"]
    assert first["error"] and second["error"] is None
    text = run("-A", APP, "calls", "show", failing, env=env).stdout
    assert "no order 9" in text.split("attempts", 1)[1] and attempt["node"] in text


def test_postgres_without_the_schema_is_one_line(env: dict[str, str]) -> None:
    """PostgreSQL answers `relation does not exist` (or an unknown DEX_DATABASE_SCHEMA): one
    line naming the fix, for the command and for the client alike."""
    with postgres_schema() as url:
        for extra in ({}, {"DEX_DATABASE_SCHEMA": "no_such_schema"}):
            environ = {**env, "DEX_DATABASE_URL": url, **extra}
            line = one_error_line(run("-A", APP, "approvals", "list", env=environ))
            assert "no dex-celery schema" in line and f"dex-celery -A {APP} db upgrade" in line
            _app, guest = make_app(Settings.from_env(environ))
            with pytest.raises(SchemaMissing):
                guest.client().get_call("s/t/c")
            guest.store.engine.dispose()


def test_the_client_raises_dex_celery_errors_when_the_database_is_down(
    env: dict[str, str],
) -> None:
    url = f"postgresql+psycopg://postgres@127.0.0.1:{free_port()}/test"
    _app, down = make_app(Settings.from_env({**env, "DEX_DATABASE_URL": url}))
    with pytest.raises(DatabaseUnavailable, match="cannot use the database"):
        down.client().get_call("s/t/c")
    with pytest.raises(DatabaseUnavailable):
        down.client().request_call("s1", "t1", "c1", "echo", {})
