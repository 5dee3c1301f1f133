"""The one Redis client factory: plain URLs, Sentinel URLs (Kombu's syntax) and their errors."""

from __future__ import annotations

import pytest
import redis
from celery import Celery

from dex_celery import Dex, Settings
from dex_celery.errors import ConfigurationError
from dex_celery.ledger.connection import (
    SentinelTarget,
    broker_transport_options,
    describe,
    parse_sentinel_url,
    redis_client,
)


def test_a_sentinel_url_names_every_sentinel_and_the_master_database() -> None:
    target = parse_sentinel_url(
        "sentinel://:s3cret@10.0.0.1:26379/2;sentinel://10.0.0.2;sentinel://10.0.0.3:26380",
        "mymaster",
    )
    assert target == SentinelTarget(
        sentinels=(("10.0.0.1", 26379), ("10.0.0.2", 26379), ("10.0.0.3", 26380)),
        master="mymaster",
        db=2,
        password="s3cret",
    )


@pytest.mark.parametrize(
    ("url", "master", "says"),
    [
        ("sentinel://10.0.0.1:26379", None, "DEX_REDIS_SENTINEL_MASTER"),
        ("sentinel://10.0.0.1:26379;redis://10.0.0.2:6379", "m", "is not sentinel://"),
        ("sentinel://10.0.0.1:notaport", "m", "bad port"),
        ("sentinel://10.0.0.1:26379/zero", "m", "is not a number"),
        ("sentinel://:pw@", "m", "is not sentinel://"),
    ],
)
def test_a_bad_sentinel_setting_is_a_configuration_error(
    url: str, master: str | None, says: str
) -> None:
    with pytest.raises(ConfigurationError, match=says) as caught:
        parse_sentinel_url(url, master)
    assert "pw" not in str(caught.value)


def test_plain_urls_give_a_plain_client_and_sentinel_urls_a_sentinel_managed_one() -> None:
    plain = redis_client("redis://127.0.0.1:1/3")
    assert plain.connection_pool.connection_kwargs["db"] == 3
    managed = redis_client("sentinel://127.0.0.1:1", sentinel_master="mymaster")
    assert type(managed.connection_pool).__name__ == "SentinelConnectionPool"
    assert isinstance(managed, redis.Redis)


def test_the_broker_gets_the_master_name_only_for_a_sentinel_url() -> None:
    assert broker_transport_options(Settings(redis_url="redis://h:6379/0")) == {}
    options = broker_transport_options(
        Settings(redis_url="sentinel://h:26379", redis_sentinel_master="mymaster")
    )
    assert options["master_name"] == "mymaster"


def test_a_dex_on_sentinel_configures_kombu_and_refuses_a_missing_master(tmp_path: object) -> None:
    settings = Settings(
        redis_url="sentinel://127.0.0.1:26379;sentinel://127.0.0.2:26379",
        redis_sentinel_master="mymaster",
        database_url="sqlite://",
    )
    app = Celery("t")
    Dex(app, settings)
    assert app.conf.broker_url.startswith("sentinel://")
    assert app.conf.broker_transport_options["master_name"] == "mymaster"
    with pytest.raises(ConfigurationError, match="DEX_REDIS_SENTINEL_MASTER"):
        Dex(Celery("u"), Settings(redis_url="sentinel://127.0.0.1:26379", database_url="sqlite://"))


def test_passwords_never_reach_log_lines() -> None:
    assert (
        describe("sentinel://:pw@h:1;sentinel://:pw@g:2")
        == "sentinel://:***@h:1;sentinel://:***@g:2"
    )
    assert describe("redis://u:pw@h:6379/0") == "redis://u:***@h:6379/0"
