"""The one settings object, built from the Celery app's configuration and the environment.

Every default is written once, here, beside the environment variable that overrides it. Each
field is also read from the Celery app's configuration as `dex_<field>` (so a Django project
sets `CELERY_DEX_REDIS_URL` beside `CELERY_BROKER_URL` when Celery reads its settings with
`namespace="CELERY"`). One precedence, lowest first: the default, the app's configuration, the
environment (`DEX_<FIELD>`), then arguments given in code. The environment wins over the app's
configuration as it does in Celery itself (`CELERY_BROKER_URL` in the environment beats a
configured `broker_url`): the same settings module then serves every host, and a deployment
changes one value without editing code (docs/django.md). The
defaults are chosen so that a worker killed mid-call gets its terminal record within
`2 * heartbeat_timeout + sweep_interval` (5 + 5 + 2 = 12 s, under the 15 s target).
"""

from __future__ import annotations

import dataclasses
import math
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, fields
from typing import Any

from dex_celery.backend_errors import check_database_url, check_redis_url
from dex_celery.errors import ConfigurationError, InvalidRequest
from dex_celery.model.budgets import Budget, parse_budgets
from dex_celery.model.times import DURATION_FORMS, parse_duration, parse_seconds

#: PostgreSQL schema holding dex-celery's tables and its Alembic version table, so it lives beside
#: a host application's own tables and migrations; None: the connection's default schema.
DEFAULT_DATABASE_SCHEMA: str | None = None
#: Where the ledger, the events stream and (by default) the broker live.
DEFAULT_REDIS_URL = "redis://127.0.0.1:6379/0"
#: The system of record. A SQLite file in the working directory unless configured.
DEFAULT_DATABASE_URL = "sqlite:///dex-celery.db"
#: Largest JSON encoding of one call's arguments (S9.3).
DEFAULT_MAX_ARGUMENT_BYTES = 1024 * 1024
#: Largest user message text accepted by `send_user_message`.
DEFAULT_MAX_TEXT_BYTES = 64 * 1024
#: Largest JSON encoding of one tool result kept in Redis and SQL; a larger one is replaced by a
#: note saying so (the model cannot use megabytes anyway, and each copy would cost that much).
DEFAULT_MAX_RESULT_BYTES = 1024 * 1024
#: Key that seals the values of `secret_arguments` (docs/secrets.md); none: such calls are refused.
DEFAULT_SECRET_KEY: str | None = None
#: How long an attempt may wait in the queue before a worker claims it (S3.5).
DEFAULT_SCHEDULE_TO_START = 60.0
#: How long an attempt may run (S3.5); also Celery's soft time limit for the attempt.
DEFAULT_START_TO_CLOSE = 300.0
#: How long a running attempt's lease lasts without a heartbeat (S3.5).
DEFAULT_HEARTBEAT_TIMEOUT = 5.0
#: How long a call may wait for a person's decision (S3.5, S6).
DEFAULT_APPROVAL_TIMEOUT = 24 * 3600.0
#: Attempts of a `read` / `idempotent_write` call unless its policy says otherwise.
DEFAULT_MAX_ATTEMPTS = 3
#: First retry delay; doubled per attempt, capped, with full jitter.
DEFAULT_BACKOFF_INITIAL = 0.5
DEFAULT_BACKOFF_MAX = 30.0
#: Seconds between sweeps (the sweeper thread of beat, or `dex-celery sweep --loop`).
DEFAULT_SWEEP_INTERVAL = 2.0
#: Beat interval of the reconcile job (S8.4); unknown outcomes are rare and checks call other
#: services, so it runs less often than the sweeper.
DEFAULT_RECONCILE_INTERVAL = 30.0
#: How long one async outcome check may take before it counts as a failure of that run.
DEFAULT_CHECK_TIMEOUT = 30.0
#: Items one sweep handles per index; the rest wait for the next sweep.
DEFAULT_SWEEP_BATCH = 500
#: A finished outcome not yet in SQL is written by the sweeper after this long.
DEFAULT_UNRECORDED_GRACE = 5.0
#: A caller waiting for an outcome the ledger decided writes it to SQL itself once the worker's
#: recorder has not within this long (`DexClient.wait`); 0: at once.
DEFAULT_RECORD_WAIT = 0.2
#: A SQL call in flight without a ledger entry is examined after this long.
DEFAULT_ORPHAN_GRACE = 10.0
#: How long a finished call's ledger entry stays in Redis (evidence for `calls show`).
DEFAULT_FINISHED_TTL = 3600
#: Approximate length cap of the events stream.
DEFAULT_EVENTS_MAXLEN = 100_000
#: Celery task events (task-sent from clients, task-received/started/succeeded from workers):
#: Flower's view of every attempt. Off saves two to four Redis PUBLISHes per call.
DEFAULT_TASK_EVENTS = True
#: Prefix of every Redis key the ledger writes.
DEFAULT_KEY_PREFIX = "dex"
#: People who may sign in to `dex-celery web`: `name:password` pairs, comma-separated. Unset and
#: without `web_tokens`, the web app serves only a loopback address, unauthenticated.
DEFAULT_WEB_USERS: str | None = None
#: Bearer tokens for scripts and Prometheus scrapes of `dex-celery web` and `dex-celery mcp`:
#: `name:token` (scopes `metrics` and `calls:read`) or `name:token:scope+scope` entries,
#: comma-separated (`dex_celery.access`, docs/security.md).
DEFAULT_WEB_TOKENS: str | None = None
#: Host names (optionally `name:port`) the web app and the MCP HTTP server answer to besides the
#: loopback names, comma-separated; a request naming any other `Host` is refused (DNS rebinding).
DEFAULT_ALLOWED_HOSTS: str | None = None
#: Addresses (or networks) of reverse proxies whose `X-Forwarded-Proto` / `X-Forwarded-For` the
#: web app believes, comma-separated; none: such headers are ignored.
DEFAULT_WEB_TRUSTED_PROXIES: str | None = None
#: Key that signs the web app's session cookies; random per process when unset (sign-ins then
#: end when the web app restarts).
DEFAULT_WEB_SECRET_KEY: str | None = None
#: Port of a worker's own Prometheus endpoint (0: none; the web app's `/metrics` has the same).
DEFAULT_WORKER_METRICS_PORT = 0
#: Address that endpoint listens on: loopback unless set; beyond loopback it needs `web_users` or
#: `web_tokens` (a token with the scope `metrics`), like the web app.
DEFAULT_WORKER_METRICS_HOST = "127.0.0.1"
#: Where beat sends webhooks (awaiting approval, outcome unknown, reconciliation reports):
#: URLs, comma-separated. None: no webhooks.
DEFAULT_WEBHOOK_URLS: str | None = None
#: Key of the HMAC-SHA256 signature of each webhook body (header `X-Dex-Signature`).
DEFAULT_WEBHOOK_SECRET: str | None = None
#: Tries of one webhook delivery before it is given up; delays double from `webhook_backoff`.
DEFAULT_WEBHOOK_MAX_ATTEMPTS = 8
DEFAULT_WEBHOOK_BACKOFF = 1.0
#: Seconds one webhook POST may take.
DEFAULT_WEBHOOK_TIMEOUT = 5.0
#: With a `sentinel://` Redis URL: the name of the master the Sentinels monitor.
DEFAULT_REDIS_SENTINEL_MASTER = None
#: A claim counts only once this many replicas hold it (Redis `WAIT`); 0 = the primary alone.
DEFAULT_CLAIM_REPLICAS = 0
#: How long a worker waits for those replicas before it gives the attempt up unrun.
DEFAULT_CLAIM_REPLICAS_TIMEOUT = 1.0
#: Refuse to start (instead of warning) when Redis's configuration can lose claims.
DEFAULT_REQUIRE_DURABLE_REDIS = False
#: Run the sweeper as a thread of `celery beat` (it then never waits for a tool slot).
DEFAULT_SWEEP_IN_BEAT = True
#: `DEX_REDIS_URL` names a node of a Redis Cluster (also said by a `redis+cluster://` URL).
DEFAULT_REDIS_CLUSTER = False
#: Seconds a worker's warm shutdown (SIGTERM) lets its running tools finish before it ends them
#: itself, as a SIGKILL would (docs/reliability.md, "Deploys"); 0: no limit of its own, the
#: supervisor's stop timeout is the grace (systemd's `TimeoutStopSec`, Kubernetes'
#: `terminationGracePeriodSeconds`, `docker stop -t`).
DEFAULT_SHUTDOWN_GRACE = 0.0
#: Seconds a worker holds a message of a tool it does not have (an older release during a
#: rolling deploy) before it hands the message back to the queue for a worker that has it.
DEFAULT_UNKNOWN_TOOL_REQUEUE_DELAY = 1.0
#: Shards of the ledger, each with its own hash tag (docs/redis.md, "Redis Cluster"). Fixed for
#: the life of a ledger: changing it needs a drained ledger (no call in flight).
DEFAULT_LEDGER_SHARDS = 1
#: How long ended calls are kept (`30d`, `12h`): beat removes older ones, archived first
#: (docs/operations.md, "Retention"). None: history is kept forever.
DEFAULT_RETENTION: str | None = None
#: Seconds between beat's retention runs (when `retention` is set).
DEFAULT_RETENTION_INTERVAL = 3600.0
#: Where beat's retention runs write their archives (one gzip JSON-lines file per run that
#: removes anything); `dex-celery history prune` writes there too unless given `--archive`.
DEFAULT_RETENTION_ARCHIVE = "dex-celery-archive"
#: Calls removed per transaction by a prune: small, so running workers never wait long on it.
DEFAULT_PRUNE_BATCH = 500
# --- the session timeline (S13.6) ---
#: Where people reach `dex-celery web` (`https://dex.example.com`): a call's trace names its
#: session's page there (`dex.session_url`). None: spans carry only `dex.session_id`.
DEFAULT_WEB_BASE_URL: str | None = None

# --- previews (docs/guardrails.md, "Previews") ---
#: Seconds a tool's preview function may take on a worker (and its message may wait to be
#: taken) before the approval shows "preview unavailable".
DEFAULT_PREVIEW_TIMEOUT = 10.0

# --- write budgets (S13.1, docs/guardrails.md "Budgets") ---
#: Write budgets declared by the deployment: `;`-separated `NAME: key=value ...` entries, e.g.
#: `refunds: tools=refund_order+credit_note limit=3 scope=session window=session`
#: (`model/budgets.py`, `parse_budgets`). None: only the budgets tools' policies declare.
DEFAULT_BUDGETS: str | None = None

# --- readiness at start (docs/operations.md, "Probes") ---
#: Seconds a worker or beat waits at start for its database and Redis to answer (a deployment
#: starting all at once) before it refuses with the error and exits 1; a schema that is missing
#: or too old is refused at once. 0: refuse at once.
DEFAULT_STARTUP_WAIT = 30.0


@dataclass(frozen=True, slots=True)
class Settings:
    """Deployment settings; build with `Settings.from_env()` and change with `replace()`."""

    redis_url: str = DEFAULT_REDIS_URL
    broker_url: str | None = None
    database_url: str = DEFAULT_DATABASE_URL
    database_schema: str | None = DEFAULT_DATABASE_SCHEMA
    key_prefix: str = DEFAULT_KEY_PREFIX
    max_argument_bytes: int = DEFAULT_MAX_ARGUMENT_BYTES
    max_text_bytes: int = DEFAULT_MAX_TEXT_BYTES
    max_result_bytes: int = DEFAULT_MAX_RESULT_BYTES
    secret_key: str | None = dataclasses.field(default=DEFAULT_SECRET_KEY, repr=False)
    schedule_to_start: float = DEFAULT_SCHEDULE_TO_START
    start_to_close: float = DEFAULT_START_TO_CLOSE
    heartbeat_timeout: float = DEFAULT_HEARTBEAT_TIMEOUT
    approval_timeout: float = DEFAULT_APPROVAL_TIMEOUT
    max_attempts: int = DEFAULT_MAX_ATTEMPTS
    backoff_initial: float = DEFAULT_BACKOFF_INITIAL
    backoff_max: float = DEFAULT_BACKOFF_MAX
    sweep_interval: float = DEFAULT_SWEEP_INTERVAL
    reconcile_interval: float = DEFAULT_RECONCILE_INTERVAL
    check_timeout: float = DEFAULT_CHECK_TIMEOUT
    sweep_batch: int = DEFAULT_SWEEP_BATCH
    unrecorded_grace: float = DEFAULT_UNRECORDED_GRACE
    record_wait: float = DEFAULT_RECORD_WAIT
    orphan_grace: float = DEFAULT_ORPHAN_GRACE
    finished_ttl: int = DEFAULT_FINISHED_TTL
    events_maxlen: int = DEFAULT_EVENTS_MAXLEN
    task_events: bool = DEFAULT_TASK_EVENTS
    web_users: str | None = dataclasses.field(default=DEFAULT_WEB_USERS, repr=False)
    web_tokens: str | None = dataclasses.field(default=DEFAULT_WEB_TOKENS, repr=False)
    web_secret_key: str | None = dataclasses.field(default=DEFAULT_WEB_SECRET_KEY, repr=False)
    allowed_hosts: str | None = DEFAULT_ALLOWED_HOSTS
    web_trusted_proxies: str | None = DEFAULT_WEB_TRUSTED_PROXIES
    worker_metrics_port: int = DEFAULT_WORKER_METRICS_PORT
    worker_metrics_host: str = DEFAULT_WORKER_METRICS_HOST
    webhook_urls: str | None = DEFAULT_WEBHOOK_URLS
    webhook_secret: str | None = DEFAULT_WEBHOOK_SECRET
    webhook_max_attempts: int = DEFAULT_WEBHOOK_MAX_ATTEMPTS
    webhook_backoff: float = DEFAULT_WEBHOOK_BACKOFF
    webhook_timeout: float = DEFAULT_WEBHOOK_TIMEOUT
    redis_sentinel_master: str | None = DEFAULT_REDIS_SENTINEL_MASTER
    claim_replicas: int = DEFAULT_CLAIM_REPLICAS
    claim_replicas_timeout: float = DEFAULT_CLAIM_REPLICAS_TIMEOUT
    require_durable_redis: bool = DEFAULT_REQUIRE_DURABLE_REDIS
    sweep_in_beat: bool = DEFAULT_SWEEP_IN_BEAT
    redis_cluster: bool = DEFAULT_REDIS_CLUSTER
    ledger_shards: int = DEFAULT_LEDGER_SHARDS
    shutdown_grace: float = DEFAULT_SHUTDOWN_GRACE
    unknown_tool_requeue_delay: float = DEFAULT_UNKNOWN_TOOL_REQUEUE_DELAY
    retention: str | None = DEFAULT_RETENTION
    retention_interval: float = DEFAULT_RETENTION_INTERVAL
    retention_archive: str = DEFAULT_RETENTION_ARCHIVE
    prune_batch: int = DEFAULT_PRUNE_BATCH
    # The audit log (docs/audit.md): the Ed25519 signing key, by value or by file, and the
    # public keys `audit verify` accepts (comma-separated keys or files; old keys kept there
    # after a rotation). Without a signing key entries are chained but unsigned.
    audit_key: str | None = dataclasses.field(default=None, repr=False)
    audit_key_file: str | None = None
    audit_public_keys: str | None = None
    # --- the session timeline (S13.6) ---
    web_base_url: str | None = DEFAULT_WEB_BASE_URL
    # --- previews ---
    preview_timeout: float = DEFAULT_PREVIEW_TIMEOUT
    # --- write budgets ---
    budgets: str | None = DEFAULT_BUDGETS
    # --- readiness at start ---
    startup_wait: float = DEFAULT_STARTUP_WAIT

    def __post_init__(self) -> None:
        for name in DURATION_SETTINGS:  # `Settings(approval_timeout="2h")` in code, as in env
            value = getattr(self, name)
            if isinstance(value, str):
                object.__setattr__(self, name, _duration(f"setting {name}", value, name))
            elif isinstance(value, float) and not math.isfinite(value):
                raise ConfigurationError(f"setting {name} must be a finite duration, got {value!r}")
        positive = (
            "max_argument_bytes",
            "max_text_bytes",
            "max_result_bytes",
            "schedule_to_start",
            "start_to_close",
            "heartbeat_timeout",
            "approval_timeout",
            "max_attempts",
            "sweep_interval",
            "reconcile_interval",
            "check_timeout",
            "sweep_batch",
            "finished_ttl",
            "events_maxlen",
            "webhook_max_attempts",
            "webhook_backoff",
            "webhook_timeout",
            "claim_replicas_timeout",
            "ledger_shards",
            "unknown_tool_requeue_delay",
            "retention_interval",
            "prune_batch",
            "preview_timeout",
        )
        for name in positive:
            if getattr(self, name) <= 0:
                raise ConfigurationError(
                    f"setting {name} must be positive, got {getattr(self, name)!r}"
                )
        if not 0 <= self.worker_metrics_port <= 65535:
            raise ConfigurationError(
                f"setting worker_metrics_port must be 0 (off) or a port, got {self.worker_metrics_port!r}"
            )
        if self.record_wait < 0:
            raise ConfigurationError(
                f"setting record_wait must be 0 or more, got {self.record_wait!r}"
            )
        if self.startup_wait < 0:
            raise ConfigurationError(
                f"setting startup_wait must be 0 or more, got {self.startup_wait!r}"
            )
        if self.shutdown_grace < 0:
            raise ConfigurationError(
                f"setting shutdown_grace must be 0 (no limit) or more, got {self.shutdown_grace!r}"
            )
        if self.claim_replicas < 0:
            raise ConfigurationError(
                f"setting claim_replicas must be 0 or more, got {self.claim_replicas!r}"
            )
        if self.retention is not None:
            try:
                parse_duration(self.retention, option=env_name("retention"))
            except InvalidRequest as e:
                raise ConfigurationError(str(e)) from None
        if self.web_base_url is not None and not _WEB_BASE_URL.fullmatch(self.web_base_url):
            raise ConfigurationError(
                f"setting web_base_url {self.web_base_url!r} must be an http:// or https:// "
                "address with no query or fragment (where people reach `dex-celery web`)"
            )
        if not self.retention_archive:
            raise ConfigurationError("setting retention_archive must name a directory")
        check_redis_url(env_name("redis_url"), self.redis_url)
        check_database_url(self.database_url)
        if self.database_schema is not None:
            if not _IDENTIFIER.fullmatch(self.database_schema):
                raise ConfigurationError(
                    f"database_schema {self.database_schema!r} must be a plain identifier "
                    "(letters, digits, underscore; at most 63 characters)"
                )
            if self.database_url.startswith("sqlite"):
                raise ConfigurationError(
                    "database_schema needs PostgreSQL; SQLite has no schemas (use its own file)"
                )
        if not self.key_prefix or "{" in self.key_prefix or "}" in self.key_prefix:
            raise ConfigurationError(
                f"key_prefix {self.key_prefix!r} must be non-empty, without braces"
            )
        if self.budgets is not None:
            parse_budgets(self.budgets)
            if self.ledger_shards > 1:
                raise ConfigurationError(
                    "write budgets need a ledger of one shard (a budget's scope and the calls "
                    "it admits share one slot): set ledger_shards to 1 or remove budgets"
                )
        if self.ledger_cluster and self.claim_replicas > 0:
            raise ConfigurationError(
                "claim_replicas is not supported with the ledger on a Redis Cluster yet (its WAIT "
                "would have to reach the primary of each claim's shard): set it to 0"
            )
        if self.ledger_cluster and self.broker_url is None:
            raise ConfigurationError(
                "the ledger is on a Redis Cluster, which cannot serve as Celery's broker: set "
                "DEX_BROKER_URL to a single Redis (redis://...) or RabbitMQ (amqp://...)"
            )

    @property
    def ledger_cluster(self) -> bool:
        """Whether the ledger's Redis is a Redis Cluster (`redis_cluster`, or the URL says so)."""
        return self.redis_cluster or self.redis_url.partition("://")[0].endswith("+cluster")

    @property
    def budget_list(self) -> tuple[Budget, ...]:
        """The budgets the settings declare (`budgets`, parsed)."""
        return parse_budgets(self.budgets)

    @property
    def retention_seconds(self) -> float | None:
        """`retention` in seconds; None: history is kept forever."""
        if self.retention is None:
            return None
        return parse_duration(self.retention, option=env_name("retention"))

    @property
    def effective_broker_url(self) -> str:
        """The broker defaults to the ledger's Redis: one service to run."""
        return self.broker_url or self.redis_url

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None, **overrides: Any) -> Settings:
        """Read `DEX_<FIELD>` variables (e.g. `DEX_REDIS_URL`, `DEX_HEARTBEAT_TIMEOUT`)."""
        return cls(**{**_from_environ(environ), **overrides})

    @classmethod
    def from_app(
        cls, conf: Any, environ: Mapping[str, str] | None = None, **overrides: Any
    ) -> Settings:
        """Read `dex_<field>` from a Celery app's configuration (`app.conf`), then `DEX_<FIELD>`
        variables over it, then `overrides`. With `config_from_object(..., namespace="CELERY")`
        the app's keys are `CELERY_DEX_<FIELD>` (Celery maps them). A `dex_` key that names
        no field raises `ConfigurationError` (a misspelt setting is not silently ignored)."""
        return cls(**{**_from_app_conf(conf), **_from_environ(environ), **overrides})


#: Settings that are durations: each takes a number of seconds or `30s`, `5m`, `2h`, `30d`
#: (`parse_seconds`), from the environment, the app's configuration and code alike. `retention`
#: is one too, with its unit required (`parse_duration`: a bare number is refused).
DURATION_SETTINGS = (
    "schedule_to_start",
    "start_to_close",
    "heartbeat_timeout",
    "approval_timeout",
    "backoff_initial",
    "backoff_max",
    "sweep_interval",
    "reconcile_interval",
    "check_timeout",
    "unrecorded_grace",
    "record_wait",
    "orphan_grace",
    "finished_ttl",
    "webhook_backoff",
    "webhook_timeout",
    "claim_replicas_timeout",
    "shutdown_grace",
    "unknown_tool_requeue_delay",
    "retention_interval",
    "preview_timeout",
    "startup_wait",
)


def _duration(label: str, raw: str, name: str) -> float | int:
    """A duration setting's text as seconds (whole seconds, rounded up, for `finished_ttl`,
    a Redis expiry); a `ConfigurationError` naming the setting otherwise."""
    try:
        seconds = parse_seconds(raw, option=label)
    except InvalidRequest:
        raise ConfigurationError(f"{label}={raw!r} is not a duration ({DURATION_FORMS})") from None
    if name == "finished_ttl":
        return math.ceil(seconds)
    return seconds


#: `http(s)://host[:port][/path]`, nothing after the path (a session's path is appended).
_WEB_BASE_URL = re.compile(r"https?://[^\s/?#]+(/[^\s?#]*)?")
_IDENTIFIER = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,62}")
#: The prefix of dex-celery's keys in a Celery app's configuration.
APP_PREFIX = "dex_"


def env_name(field_name: str) -> str:
    """The environment variable that sets a field: `heartbeat_timeout` -> `DEX_HEARTBEAT_TIMEOUT`."""
    return "DEX_" + field_name.upper()


def app_name(field_name: str) -> str:
    """The Celery configuration key that sets a field: `redis_url` -> `dex_redis_url`."""
    return APP_PREFIX + field_name


def _from_environ(environ: Mapping[str, str] | None) -> dict[str, Any]:
    env = os.environ if environ is None else environ
    values: dict[str, Any] = {}
    for field in fields(Settings):
        raw = env.get(env_name(field.name))
        if raw is not None:
            values[field.name] = _parse(env_name(field.name), raw, field.type, field.name)
    return values


def _from_app_conf(conf: Any) -> dict[str, Any]:
    """The `dex_*` keys of a Celery configuration (a namespace prefix such as `CELERY_` is
    Celery's to strip: `conf.get` looks a key up under it)."""
    known = {f.name: f for f in fields(Settings)}
    keys = list(conf.keys())  # loads a pending configuration (its namespace is known after)
    namespace = str(getattr(conf, "prefix", None) or "")
    for key in keys:
        name = str(key)
        if namespace:  # only the keys under it are Celery's (a Django project has many more)
            if not name.upper().startswith(namespace.upper()):
                continue
            name = name[len(namespace) :]
        name = name.lower()
        if name.startswith(APP_PREFIX) and name[len(APP_PREFIX) :] not in known:
            raise ConfigurationError(
                f"the Celery configuration sets {key}, which is no dex-celery setting "
                f"(they are {APP_PREFIX}<field> for the fields of Settings: docs/django.md)"
            )
    values: dict[str, Any] = {}
    for field in known.values():
        value = conf.get(app_name(field.name))
        if value is not None:
            values[field.name] = _typed(app_name(field.name), value, field.type, field.name)
    return values


#: How a message names each field type.
_KINDS = {"bool": "a boolean", "int": "an integer", "float": "a number"}


def _typed(label: str, value: Any, annotation: object, name: str) -> Any:
    """A configuration value as its field's type: text is parsed as an environment variable's
    would be (`CELERY_DEX_APPROVAL_TIMEOUT = "2h"`); a Python value must already be of the
    type."""
    if isinstance(value, str):
        return _parse(label, value, annotation, name)
    kind = str(annotation)
    ok = {
        "bool": isinstance(value, bool),
        "int": isinstance(value, int) and not isinstance(value, bool),
        "float": isinstance(value, int | float) and not isinstance(value, bool),
    }.get(kind, False)
    if not ok:
        wanted = f"a duration ({DURATION_FORMS})" if name in DURATION_SETTINGS else None
        wanted = wanted or _KINDS.get(kind, "text")
        raise ConfigurationError(f"{label}={value!r} is not {wanted}")
    return float(value) if kind == "float" else value


def _parse(label: str, raw: str, annotation: object, name: str) -> Any:
    if name in DURATION_SETTINGS:
        return _duration(label, raw, name)
    kind = str(annotation)
    if kind == "bool":
        truthy, falsy = {"1", "true", "yes", "on"}, {"0", "false", "no", "off"}
        if raw.strip().lower() in truthy | falsy:
            return raw.strip().lower() in truthy
        raise ConfigurationError(f"{label}={raw!r} is not a boolean (1/0, true/false)")
    try:
        if kind == "int":
            return int(raw)
        if kind == "float":
            return float(raw)
    except ValueError as e:
        raise ConfigurationError(f"{label}={raw!r} is not a number") from e
    return raw or None if "None" in kind else raw
