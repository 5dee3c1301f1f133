"""The one place a Redis client is built: a single server, or the master Sentinel names.

Every component (the ledger of workers, the sweeper, beat, the CLI, startup checks) gets its
client from `redis_client`, so a deployment switches to Redis Sentinel, the supported
high-availability setup, by changing settings only:

    DEX_REDIS_URL=sentinel://10.0.0.1:26379;sentinel://10.0.0.2:26379;sentinel://10.0.0.3:26379
    DEX_REDIS_SENTINEL_MASTER=mymaster

The URL syntax is Kombu's (`sentinel://[:password@]host:port[/db]`, one per Sentinel, joined by
`;`), so the same value can serve as the broker URL; `broker_transport_options` hands Kombu the
master name. The password and database number are taken from the first part and apply to the
master; Sentinels themselves are reached without authentication.

A Redis Cluster holds a sharded ledger (docs/redis.md, "Redis Cluster"):
`redis+cluster://host1:port1,host2:port2,...` (the nodes a new client may ask for the cluster's
map: name several, since a client started while the one named is down must still find the
others) or `DEX_REDIS_CLUSTER=1` with a `redis://` URL. The
client is redis-py's `RedisCluster`, which routes each command and script to the primary of its
keys' slot and follows a failover's new map on the next command. It has the `redis.Redis`
methods the ledger uses; the broker stays a separate single Redis or RabbitMQ.

A client built on Sentinel asks the Sentinels for the master on every new connection, so after
a failover the next command (after the connection error the old master's death causes) goes to
the promoted replica. What a promotion can lose is the subject of `docs/redis.md`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, cast
from urllib.parse import unquote, urlsplit

import redis
from redis.cluster import ClusterNode, RedisCluster
from redis.sentinel import Sentinel

from dex_celery.errors import ConfigurationError

if TYPE_CHECKING:
    from dex_celery.settings import Settings

SENTINEL_SCHEME = "sentinel"
#: Redis Sentinel's default port, used when a `sentinel://` part names none.
DEFAULT_SENTINEL_PORT = 26379
#: Seconds to wait for one Sentinel's answer before asking the next one.
SENTINEL_SOCKET_TIMEOUT = 1.0

#: Timeouts of every ledger connection: a command waits at most this long for Redis's answer
#: (a lost primary must not hang a worker), and a new connection at most `CONNECT_TIMEOUT`.
SOCKET_TIMEOUT = 10.0
CONNECT_TIMEOUT = 5.0
HEALTH_CHECK_INTERVAL = 30


@dataclass(frozen=True, slots=True)
class SentinelTarget:
    """A Redis master found through Sentinel: where the Sentinels are and the master's name."""

    sentinels: tuple[tuple[str, int], ...]
    master: str
    db: int = 0
    username: str | None = None
    password: str | None = None


def is_sentinel_url(url: str) -> bool:
    return url.strip().lower().startswith(SENTINEL_SCHEME + "://")


def parse_sentinel_url(url: str, master: str | None) -> SentinelTarget:
    """`sentinel://h1:26379;sentinel://h2:26379/0` plus the master's name -> `SentinelTarget`.

    Raises `ConfigurationError` for a malformed URL or a missing master name: a deployment
    that cannot find its ledger must not start.
    """
    if not master:
        raise ConfigurationError(
            f"the Redis URL {_redacted(url)!r} names Sentinels: set DEX_REDIS_SENTINEL_MASTER to "
            "the name of the master they monitor (e.g. mymaster)"
        )
    sentinels: list[tuple[str, int]] = []
    first: Any = None
    for part in filter(None, (p.strip() for p in url.split(";"))):
        parsed = urlsplit(part)
        if parsed.scheme.lower() != SENTINEL_SCHEME or not parsed.hostname:
            raise ConfigurationError(
                f"{_redacted(part)!r} in the Redis URL is not sentinel://host:port[/db]"
            )
        try:
            port = parsed.port or DEFAULT_SENTINEL_PORT
        except ValueError as e:
            raise ConfigurationError(f"bad port in {_redacted(part)!r}: {e}") from e
        sentinels.append((parsed.hostname, port))
        first = first or parsed
    if first is None:
        raise ConfigurationError("the Redis URL names no Sentinel")
    path = first.path.strip("/")
    if path and not path.isdigit():
        raise ConfigurationError(f"database {path!r} in the Redis URL is not a number")
    return SentinelTarget(
        sentinels=tuple(sentinels),
        master=master,
        db=int(path or 0),
        username=unquote(first.username) if first.username else None,
        password=unquote(first.password) if first.password else None,
    )


def is_cluster_url(url: str) -> bool:
    return url.strip().lower().partition("://")[0].endswith("+cluster")


def redis_client(
    url: str,
    *,
    sentinel_master: str | None = None,
    cluster: bool = False,
    decode_responses: bool = True,
    socket_timeout: float = SOCKET_TIMEOUT,
    socket_connect_timeout: float = CONNECT_TIMEOUT,
) -> redis.Redis:
    """A client of the Redis at `url`: `redis://`, `rediss://`, `unix://`, Sentinels, or a
    Redis Cluster (`redis+cluster://`, or `cluster`)."""
    options: dict[str, Any] = {
        "decode_responses": decode_responses,
        "socket_timeout": socket_timeout,
        "socket_connect_timeout": socket_connect_timeout,
        "health_check_interval": HEALTH_CHECK_INTERVAL,
    }
    if cluster or is_cluster_url(url):
        # Typed as the single-node client: it offers the same commands the ledger uses.
        return cast(redis.Redis, cluster_client(url, options))
    if not is_sentinel_url(url):
        return redis.Redis.from_url(url, **options)
    target = parse_sentinel_url(url, sentinel_master)
    sentinel = Sentinel(  # type: ignore[no-untyped-call, unused-ignore]  # untyped in older redis-py
        list(target.sentinels),
        sentinel_kwargs={
            "socket_timeout": SENTINEL_SOCKET_TIMEOUT,
            "socket_connect_timeout": SENTINEL_SOCKET_TIMEOUT,
        },
    )
    client: redis.Redis = sentinel.master_for(  # type: ignore[no-untyped-call, unused-ignore]
        target.master,
        db=target.db,
        username=target.username,
        password=target.password,
        **options,
    )
    return client


def cluster_nodes(url: str) -> tuple[str, list[tuple[str, int]]]:
    """`redis+cluster://[user:password@]h1:p1,h2:p2[/0]` -> (the URL of the first node as
    `redis://` or `rediss://`, every node named). Raises `ConfigurationError` if malformed."""
    scheme, _, rest = url.strip().partition("://")
    plain_scheme = scheme.lower().removesuffix("+cluster")
    netloc, slash, path = rest.partition("/")
    auth, at, hosts = netloc.rpartition("@")
    nodes: list[tuple[str, int]] = []
    for part in filter(None, (p.strip() for p in hosts.split(","))):
        host, colon, port = part.rpartition(":")
        if not colon or not host or not port.isdigit():
            raise ConfigurationError(
                f"{part!r} in the Redis Cluster URL {_redacted(url)!r} is not host:port"
            )
        nodes.append((host, int(port)))
    if not nodes:
        raise ConfigurationError(f"the Redis Cluster URL {_redacted(url)!r} names no node")
    first = f"{plain_scheme}://{auth}{at}{nodes[0][0]}:{nodes[0][1]}{slash}{path}"
    return first, nodes


def cluster_client(url: str, options: dict[str, Any]) -> RedisCluster:
    """redis-py's cluster client, started from every node the URL names."""
    first, nodes = cluster_nodes(url)
    parsed = urlsplit(first)
    extra: dict[str, Any] = {}
    if parsed.username:
        extra["username"] = unquote(parsed.username)
    if parsed.password:
        extra["password"] = unquote(parsed.password)
    if parsed.scheme == "rediss":
        extra["ssl"] = True
    startup = [ClusterNode(host, port) for host, port in nodes]  # type: ignore[no-untyped-call]
    return RedisCluster(startup_nodes=startup, **extra, **options)


def ledger_client(settings: Settings, **overrides: Any) -> redis.Redis:
    """The client of the ledger's Redis (`DEX_REDIS_URL`) as `settings` describe it."""
    return redis_client(
        settings.redis_url,
        sentinel_master=settings.redis_sentinel_master,
        cluster=settings.ledger_cluster,
        **overrides,
    )


def broker_transport_options(settings: Settings) -> dict[str, Any]:
    """What Kombu needs beyond the broker URL: the master's name for a `sentinel://` broker."""
    if not is_sentinel_url(settings.effective_broker_url):
        return {}
    parse_sentinel_url(settings.effective_broker_url, settings.redis_sentinel_master)
    return {
        "master_name": settings.redis_sentinel_master,
        "sentinel_kwargs": {"socket_timeout": SENTINEL_SOCKET_TIMEOUT},
    }


def describe(url: str) -> str:
    """The URL without its password, for log lines and error messages."""
    return _redacted(url)


def _redacted(url: str) -> str:
    parts = []
    for part in url.split(";"):
        parsed = urlsplit(part.strip())
        if parsed.password:
            netloc = parsed.netloc.replace(f":{parsed.password}@", ":***@", 1)
            part = parsed._replace(netloc=netloc).geturl()
        parts.append(part)
    return ";".join(parts)
