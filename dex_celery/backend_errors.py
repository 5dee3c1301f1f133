"""One exception tree at the edges: redis-py, Kombu and SQLAlchemy failures as dex-celery errors.

A caller of the client, and the `dex-celery` command, see `RedisUnavailable`,
`DatabaseUnavailable`, `SchemaMissing` or `ConfigurationError` (all `DexError`s) with the URL
(password hidden) and the first line of the cause, instead of a driver's traceback. The
original exception stays available as the error's `cause` attribute (with its own traceback),
but is not chained: a redis-py or SQLAlchemy failure carries five or more chained exceptions of
their own, and a printed dex-celery error is one short traceback whose message names the cause.
"""

from __future__ import annotations

import contextlib
import functools
import os
from collections.abc import AsyncIterator, Callable, Iterator
from typing import Any, TypeVar
from urllib.parse import urlsplit, urlunsplit

import redis
import sqlalchemy.exc
from kombu.exceptions import OperationalError as KombuOperationalError
from sqlalchemy.engine import make_url

from dex_celery.errors import (
    ConfigurationError,
    DatabaseUnavailable,
    DexError,
    RedisUnavailable,
    SchemaMissing,
)

#: PostgreSQL's SQLSTATE for "relation does not exist" / "schema does not exist".
_UNDEFINED = {"42P01", "3F000"}

UPGRADE_HINT = "run `dex-celery db upgrade` with this DEX_DATABASE_URL (and DEX_DATABASE_SCHEMA)"

T = TypeVar("T")


def safe_url(url: str) -> str:
    """`url` with its password replaced by `***`, for messages and logs."""
    try:
        parts = urlsplit(url)
    except ValueError:
        return "<unparseable URL>"
    if parts.password is None:
        return url
    netloc = parts.netloc.replace(f":{parts.password}@", ":***@", 1)
    return urlunsplit(parts._replace(netloc=netloc))


def first_line(error: BaseException | None) -> str:
    text = str(error or "").strip().splitlines()
    return text[0] if text else type(error).__name__


def missing_schema(error: sqlalchemy.exc.DBAPIError) -> bool:
    """A table (or the configured PostgreSQL schema) is not there: the database was never
    migrated, or the settings point at another database or schema."""
    orig = error.orig
    code = getattr(orig, "sqlstate", None) or getattr(orig, "pgcode", None)
    if code in _UNDEFINED:
        return True
    text = str(orig)
    return "no such table" in text or ("relation" in text and "does not exist" in text)


def translate(error: BaseException, *, redis_url: str, database_url: str) -> DexError | None:
    """The dex-celery error for `error`, or None when it is not a backend failure."""
    if isinstance(error, DexError):
        return error
    if isinstance(error, redis.RedisError):
        return RedisUnavailable(f"cannot use Redis at {safe_url(redis_url)}: {first_line(error)}")
    if isinstance(error, KombuOperationalError):
        return RedisUnavailable(f"cannot reach the broker: {first_line(error)}")
    if isinstance(error, sqlalchemy.exc.DBAPIError):
        where = safe_url(database_url)
        if missing_schema(error):
            return SchemaMissing(
                f"the database at {where} has no dex-celery schema ({first_line(error.orig)}); "
                f"{UPGRADE_HINT}"
            )
        return DatabaseUnavailable(f"cannot use the database at {where}: {first_line(error.orig)}")
    if isinstance(error, sqlalchemy.exc.NoSuchModuleError | sqlalchemy.exc.ArgumentError):
        return ConfigurationError(
            f"DEX_DATABASE_URL {safe_url(database_url)!r} is not usable: {first_line(error)}"
        )
    return None


def check_database_url(url: str) -> None:
    """Refuse a URL SQLAlchemy cannot parse or whose dialect it does not know, at start-up."""
    try:
        make_url(url).get_dialect()
    except (sqlalchemy.exc.ArgumentError, sqlalchemy.exc.NoSuchModuleError, ValueError) as e:
        raise ConfigurationError(
            f"DEX_DATABASE_URL {safe_url(url)!r} is not a database URL SQLAlchemy knows "
            f"(e.g. sqlite:///dex-celery.db, postgresql+psycopg://user@host/db): {first_line(e)}"
        ) from None


def check_redis_url(name: str, url: str) -> None:
    """Refuse a Redis URL neither redis-py nor the Sentinel support would accept (an `http://`
    URL, a bare host name)."""
    scheme = url.partition("://")[0] if "://" in url else ""
    if scheme not in ("redis", "rediss", "unix", "sentinel", "redis+cluster", "rediss+cluster"):
        raise ConfigurationError(
            f"{name} {safe_url(url)!r} is not a Redis URL (redis://host:port/db, rediss://..., "
            "unix:///path/to/socket, sentinel://host:26379;sentinel://host2:26379, or "
            "redis+cluster://host:port)"
        )


#: Exceptions of the drivers whose chains a dex-celery error does not carry (see the module).
DRIVER_ERRORS: tuple[type[BaseException], ...] = (
    redis.RedisError,
    KombuOperationalError,
    sqlalchemy.exc.SQLAlchemyError,
    OSError,
)


def _chain(error: BaseException) -> Iterator[BaseException]:
    """`error`'s causes and contexts, nearest first (each once)."""
    seen: set[int] = set()
    link: BaseException | None = error.__cause__ or error.__context__
    while link is not None and id(link) not in seen:
        seen.add(id(link))
        yield link
        link = link.__cause__ or link.__context__


def unchained(error: DexError, cause: BaseException | None = None) -> DexError:
    """`error` without the driver's chain: its cause kept as `error.cause`, not printed.

    An error whose chain holds no driver error (a tool's own exception behind a `ToolError`)
    keeps its chain: it is short, and it is the tool author's to read."""
    cause = cause if cause is not None else (error.__cause__ or error.__context__)
    if cause is None:
        return error
    if not isinstance(cause, DRIVER_ERRORS) and not any(
        isinstance(link, DRIVER_ERRORS) for link in _chain(error)
    ):
        return error
    if error.cause is None:
        error.cause = cause
    error.__cause__ = None
    error.__suppress_context__ = True
    return error


def driver_cause(error: BaseException) -> BaseException | None:
    """The driver error behind a dex-celery error, chained or kept as `cause`."""
    kept = getattr(error, "cause", None)
    return kept if kept is not None else error.__cause__


@contextlib.contextmanager
def backend_errors(redis_url: str, database_url: str) -> Iterator[None]:
    """Raise backend failures inside the block as dex-celery errors (unchained: `unchained`)."""
    try:
        yield
    except DexError as e:
        unchained(e)
        raise
    except Exception as e:
        translated = translate(e, redis_url=redis_url, database_url=database_url)
        if translated is None:
            raise
        raise unchained(translated, e) from None


def translating_backend_errors(cls: type[T]) -> type[T]:
    """Class decorator: every public method of a class of the public API (a client, `Dex`,
    `Approvals`, the sweeper, the reconciler) raises dex-celery errors only, unchained.

    The instance must have `source` (a `RuntimeSource`) or `settings`: its settings name the
    URLs in the message.
    """
    for name, member in list(vars(cls).items()):
        if name.startswith("_") or not callable(member) or isinstance(member, staticmethod):
            continue
        setattr(cls, name, _wrapped(member))
    return cls


def _wrapped(method: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(method)
    def call(self: Any, *args: Any, **kwargs: Any) -> Any:
        source = getattr(self, "source", None)
        settings = source.settings if source is not None else self.settings
        with backend_errors(settings.redis_url, settings.database_url):
            return method(self, *args, **kwargs)

    return call


def translated_iterator(items: Iterator[T], redis_url: str, database_url: str) -> Iterator[T]:
    """`items`, raising backend failures of each `next()` as dex-celery errors.

    A method that hands back an iterator returns before any read happens: the reads (and their
    failures) come on iteration, outside `translating_backend_errors`' reach."""
    while True:
        with backend_errors(redis_url, database_url):
            try:
                item = next(items)
            except StopIteration:
                return
        yield item


async def translated_async_iterator(
    items: AsyncIterator[T], redis_url: str, database_url: str
) -> AsyncIterator[T]:
    """`translated_iterator` for an async iterator."""
    while True:
        with backend_errors(redis_url, database_url):
            try:
                item = await items.__anext__()
            except StopAsyncIteration:
                return
        yield item


def require_existing_database(url: str) -> None:
    """For read-only commands: a SQLite file that does not exist is reported, not created.

    SQLite creates the file on first connect, so `calls list` in the wrong folder would leave
    an empty `dex-celery.db` behind; other databases are never created by connecting.
    """
    parsed = make_url(url)
    if parsed.get_backend_name() != "sqlite":
        return
    path = parsed.database
    if not path or path == ":memory:" or path.startswith("file:"):
        return
    if not os.path.exists(path):
        if not os.environ.get("DEX_DATABASE_URL"):
            raise SchemaMissing(
                f"no database configured: DEX_DATABASE_URL is not set and there is no "
                f"{os.path.abspath(path)} ({url}); set DEX_DATABASE_URL, or {UPGRADE_HINT}"
            )
        raise SchemaMissing(
            f"there is no database at {url} (the file {os.path.abspath(path)} does not exist); "
            f"check DEX_DATABASE_URL, or {UPGRADE_HINT}"
        )
