"""A Django project configures Celery and dex-celery from its settings, in one place.

tests/django_project is a minimal Django project as Celery's Django guide writes one
(`config_from_object("django.conf:settings", namespace="CELERY")`), its dex-celery settings
written as `CELERY_DEX_*` names beside `CELERY_BROKER_URL`. No `DEX_*` variable is set anywhere
here: `dex-celery -A tests.django_project.proj db upgrade` migrates the database its settings
name, a real prefork worker started with `celery -A tests.django_project.proj worker` runs a
call, and the record is in that database (docs/django.md).
"""

from __future__ import annotations

import os
import subprocess
import sys
import uuid
from dataclasses import fields
from pathlib import Path

import pytest

from devtools.processes import ROOT, CeleryWorker, RedisServer
from dex_celery import CallStatus, Settings
from dex_celery.settings import env_name

APP = "tests.django_project.proj"
SCRIPT = Path(sys.executable).parent / "dex-celery"

pytest.importorskip("django", reason="the dev extra brings Django")


def test_a_django_project_sets_dex_celery_where_it_sets_celery(
    redis_server: RedisServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    for field in fields(Settings):  # nothing may come from the environment
        monkeypatch.delenv(env_name(field.name), raising=False)
    database = f"sqlite:///{tmp_path / 'django-dex.db'}"
    prefix = f"dj{uuid.uuid4().hex[:8]}"
    example = {
        "DJANGO_SETTINGS_MODULE": "tests.django_project.proj.settings",
        "DJANGO_EXAMPLE_REDIS_URL": redis_server.url,
        "DJANGO_EXAMPLE_DATABASE_URL": database,
        "DJANGO_EXAMPLE_KEY_PREFIX": prefix,
    }
    for name, value in example.items():
        monkeypatch.setenv(name, value)

    environ = {k: v for k, v in os.environ.items() if not k.startswith("DEX_")}
    migrated = subprocess.run(
        [str(SCRIPT), "-A", APP, "db", "upgrade"],
        env={**environ, "PYTHONPATH": str(ROOT)},
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert migrated.returncode == 0, migrated.stderr
    assert database in migrated.stdout

    from tests.django_project.proj.celery import dex  # reads the Django settings

    assert dex.settings.redis_url == redis_server.url
    assert dex.settings.database_url == database
    assert dex.settings.key_prefix == prefix
    assert dex.settings.heartbeat_timeout == 2.5
    assert dex.settings.approval_timeout == 7200.0  # CELERY_DEX_APPROVAL_TIMEOUT = "2h"

    worker = CeleryWorker(
        APP, example, tmp_path / "ready", concurrency=1, ready_env="DJANGO_EXAMPLE_READY_DIR"
    ).start()
    try:
        client = dex.client()
        call = client.request_call("dj-session", "t1", "c1", "shout", {"text": "hello"})
        (record,) = client.wait([call.key], timeout=60)
    finally:
        worker.stop()
    assert record.status is CallStatus.SUCCEEDED, record.error
    assert record.result is not None and "HELLO" in record.result
    assert (tmp_path / "django-dex.db").exists()
