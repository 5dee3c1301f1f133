"""One duration syntax for every duration-valued setting (README, "Settings").

Each takes a number of seconds or a number and a unit (`30s`, `5m`, `2h`, `30d`), written the
same way in the environment (`DEX_APPROVAL_TIMEOUT=2h`), in the Celery configuration
(`CELERY_DEX_APPROVAL_TIMEOUT = "2h"` in a Django project) and in code
(`Settings(approval_timeout="2h")`); anything else is one `ConfigurationError` naming the
setting. `retention` alone requires its unit (a bare `30` would keep 30 seconds).
"""

from __future__ import annotations

import dataclasses

import pytest
from celery import Celery

from dex_celery.errors import ConfigurationError
from dex_celery.settings import DURATION_SETTINGS, Settings, env_name

FORMS = {"90": 90.0, "2.5": 2.5, "30s": 30.0, "5m": 300.0, "2h": 7200.0, "1d": 86400.0}


def test_every_number_of_seconds_setting_is_a_duration() -> None:
    """A new seconds-valued setting must join the list (and so the one syntax)."""
    floats = {f.name for f in dataclasses.fields(Settings) if str(f.type) == "float"}
    assert floats <= set(DURATION_SETTINGS), floats - set(DURATION_SETTINGS)
    assert "finished_ttl" in DURATION_SETTINGS


@pytest.mark.parametrize("name", DURATION_SETTINGS)
@pytest.mark.parametrize(("text", "seconds"), sorted(FORMS.items()))
def test_every_duration_setting_takes_every_form_from_the_environment(
    name: str, text: str, seconds: float
) -> None:
    value = getattr(Settings.from_env({env_name(name): text}), name)
    assert value == (int(seconds) + (seconds % 1 > 0) if name == "finished_ttl" else seconds)


def test_a_django_project_writes_durations_as_the_environment_does() -> None:
    class DjangoSettings:
        CELERY_DEX_APPROVAL_TIMEOUT = "2h"
        CELERY_DEX_SWEEP_INTERVAL = "500"
        CELERY_DEX_FINISHED_TTL = "1d"
        CELERY_DEX_HEARTBEAT_TIMEOUT = 7.5

    app = Celery("django-like", set_as_current=False)
    app.config_from_object(DjangoSettings, namespace="CELERY")
    settings = Settings.from_app(app.conf, {})
    assert settings.approval_timeout == 7200.0
    assert settings.sweep_interval == 500.0
    assert settings.finished_ttl == 86400
    assert settings.heartbeat_timeout == 7.5
    assert Settings(approval_timeout="30m").approval_timeout == 1800.0  # type: ignore[arg-type]


@pytest.mark.parametrize("bad", ["2x", "soon", "nan", "inf", "1e3", "", "h", "2 hours"])
def test_a_bad_duration_is_one_configuration_error_naming_the_setting(bad: str) -> None:
    with pytest.raises(ConfigurationError) as env_error:
        Settings.from_env({"DEX_APPROVAL_TIMEOUT": bad})
    assert str(env_error.value) == (
        f"DEX_APPROVAL_TIMEOUT={bad!r} is not a duration "
        "(a number of seconds, or a number and a unit: 30s, 5m, 2h, 30d)"
    )
    app = Celery("conf", set_as_current=False)
    app.conf.dex_approval_timeout = bad
    with pytest.raises(ConfigurationError, match="dex_approval_timeout="):
        Settings.from_app(app.conf, {})


def test_range_is_still_the_settings_own() -> None:
    with pytest.raises(ConfigurationError, match="approval_timeout must be positive"):
        Settings.from_env({"DEX_APPROVAL_TIMEOUT": "0s"})
    assert Settings.from_env({"DEX_SHUTDOWN_GRACE": "0"}).shutdown_grace == 0.0
    with pytest.raises(ConfigurationError, match="finite"):
        Settings(approval_timeout=float("nan"))


def test_retention_requires_its_unit() -> None:
    assert Settings.from_env({"DEX_RETENTION": "30d"}).retention_seconds == 30 * 86400
    with pytest.raises(ConfigurationError, match="DEX_RETENTION"):
        Settings.from_env({"DEX_RETENTION": "30"})
