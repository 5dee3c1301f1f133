"""Settings from a Celery app's configuration and the environment, one precedence (lowest
first): default, app configuration (`dex_<field>`), environment (`DEX_<FIELD>`), code."""

from __future__ import annotations

import pytest
from celery import Celery

from dex_celery import Settings
from dex_celery.errors import ConfigurationError
from dex_celery.settings import DEFAULT_REDIS_URL, app_name, env_name


def app_with(**conf: object) -> Celery:
    app = Celery("settings-test", set_as_current=False)
    app.conf.update(conf)
    return app


def test_the_app_configuration_sets_a_field_the_environment_does_not() -> None:
    app = app_with(dex_redis_url="redis://app-host:6379/1", dex_heartbeat_timeout=4)
    settings = Settings.from_app(app.conf, {})
    assert settings.redis_url == "redis://app-host:6379/1"
    assert settings.heartbeat_timeout == 4.0 and isinstance(settings.heartbeat_timeout, float)
    assert Settings.from_app(app_with().conf, {}).redis_url == DEFAULT_REDIS_URL


def test_the_environment_wins_over_the_app_and_code_over_both() -> None:
    app = app_with(dex_redis_url="redis://app-host:6379/1", dex_sweep_interval="3")
    environ = {"DEX_REDIS_URL": "redis://env-host:6379/2"}
    settings = Settings.from_app(app.conf, environ)
    assert settings.redis_url == "redis://env-host:6379/2"
    assert settings.sweep_interval == 3.0  # text in the app's configuration is parsed as env's
    coded = Settings.from_app(app.conf, environ, redis_url="redis://code-host:6379/3")
    assert coded.redis_url == "redis://code-host:6379/3"


def test_a_namespace_maps_prefixed_names_as_celery_does() -> None:
    class DjangoLikeSettings:
        CELERY_BROKER_URL = "redis://broker:6379/0"
        CELERY_DEX_KEY_PREFIX = "shop"
        CELERY_DEX_MAX_TEXT_BYTES = 1000
        DEX_UNRELATED_TO_CELERY = "a Django setting of the project's own"

    app = Celery("django-like", set_as_current=False)
    app.config_from_object(DjangoLikeSettings, namespace="CELERY")
    settings = Settings.from_app(app.conf, {})
    assert settings.key_prefix == "shop" and settings.max_text_bytes == 1000


@pytest.mark.parametrize(
    ("conf", "message"),
    [
        ({"dex_redis_ur": "redis://x"}, "dex_redis_ur, which is no dex-celery setting"),
        ({"dex_heartbeat_timeout": "soon"}, "dex_heartbeat_timeout='soon' is not a duration"),
        ({"dex_heartbeat_timeout": True}, "dex_heartbeat_timeout=True is not a duration"),
        ({"dex_redis_cluster": "maybe"}, "dex_redis_cluster='maybe' is not a boolean"),
        ({"dex_redis_url": 6379}, "dex_redis_url=6379 is not text"),
        ({"dex_ledger_shards": 2.5}, "dex_ledger_shards=2.5 is not an integer"),
    ],
)
def test_bad_app_configuration_is_a_configuration_error(
    conf: dict[str, object], message: str
) -> None:
    with pytest.raises(ConfigurationError, match=message.replace("(", r"\(")):
        Settings.from_app(app_with(**conf).conf, {})


def test_names_of_a_field() -> None:
    assert app_name("redis_url") == "dex_redis_url"
    assert env_name("redis_url") == "DEX_REDIS_URL"
