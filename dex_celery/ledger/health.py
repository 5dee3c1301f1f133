"""Startup checks: can this Redis lose a claim it acknowledged?

A claim is the proof that a tool may have run (S3.3). Redis configured to forget acknowledged
writes turns that proof into a guess: after a restart or an eviction, a call that ran looks as
if it never reached a worker. The ledger detects such a rollback and stays conservative (S10.2),
but every rollback turns calls in flight into `outcome_unknown`; this check tells the operator
before it happens.

Worker, beat and `dex-celery sweep` read `appendonly`, `appendfsync`, `maxmemory` and
`maxmemory-policy` once at start (`CONFIG GET`):

- `appendonly` must be `yes`: with `no`, a restart goes back to the last RDB snapshot (or to
  nothing) and forgets every claim made since.
- `appendfsync` must be `always`, or `everysec` when `claim_replicas` >= 1 (a replica holds each
  claim before it counts): `everysec` loses up to about a second on a machine crash, `no` up
  to ~30 s. A crash of the Redis process alone loses nothing in either case.
- `maxmemory-policy` must be `noeviction` or a `volatile-*` policy, unless `maxmemory` is 0 (no
  limit, nothing is ever evicted): `allkeys-*` evicts any key when memory is full, call hashes,
  indexes and queued messages alike.

`volatile-*` is accepted: it evicts only keys with a TTL, and the ledger puts a TTL only on the
hash of a call whose outcome SQL holds already; evicting one loses evidence for `calls show`,
not a claim. With no key to evict, Redis then refuses writes, as `noeviction` does.

By default a risk is one warning line. `require_durable_redis` (`DEX_REQUIRE_DURABLE_REDIS=1`)
makes it a refusal: `UnsafeRedis`, raised before the process takes any work. A Redis that
forbids `CONFIG` (managed services rename or ACL it away) gets one line saying its durability
could not be checked, never a crash; with `require_durable_redis` an unverifiable Redis is
refused too, since the guarantee asked for cannot be shown.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

import redis

from dex_celery.errors import ConfigurationError

log = logging.getLogger("dex_celery.ops.status")

#: The Redis settings read, as `CONFIG GET` names them.
CHECKED = ("appendonly", "appendfsync", "maxmemory", "maxmemory-policy")
#: How the operator turns the warning into a refusal (named in every message).
REQUIRE_ENV = "DEX_REQUIRE_DURABLE_REDIS"


class UnsafeRedis(ConfigurationError):
    """Redis can lose acknowledged claims, and `require_durable_redis` forbids starting on it."""


class Verdict(StrEnum):
    DURABLE = "durable"
    AT_RISK = "at_risk"
    UNCHECKED = "unchecked"


@dataclass(frozen=True, slots=True)
class DurabilityReport:
    """What one check found: the values read, the risks, or why nothing could be read."""

    verdict: Verdict
    config: tuple[tuple[str, str], ...] = ()
    risks: tuple[str, ...] = ()
    unreadable: str = ""

    def message(self, where: str) -> str:
        """One line for the log or the `error:` line of the CLI."""
        if self.verdict is Verdict.DURABLE:
            values = ", ".join(f"{k} {v}" for k, v in self.config)
            return f"Redis at {where} keeps acknowledged claims ({values})"
        if self.verdict is Verdict.UNCHECKED:
            return (
                f"could not check whether Redis at {where} can lose claims: CONFIG GET was "
                f"refused ({self.unreadable}); make sure it runs with appendonly yes, "
                "appendfsync always and maxmemory-policy noeviction (docs/redis.md)"
            )
        return (
            f"Redis at {where} can lose acknowledged claims: {'; '.join(self.risks)}. A claim lost "
            "this way turns calls in flight into outcome_unknown. Set appendonly yes, appendfsync "
            f"always and maxmemory-policy noeviction (docs/redis.md); {REQUIRE_ENV}=1 refuses to "
            "start instead of warning"
        )


def read_config(client: redis.Redis) -> dict[str, str]:
    """The checked settings, as Redis reports them (one round trip)."""
    return {_text(k): _text(v) for k, v in _config_get(client).items()}


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _config_get(client: redis.Redis) -> dict[str, Any]:
    # CONFIG GET takes several patterns since Redis 7.0; one call per name works everywhere.
    found: dict[str, Any] = {}
    if isinstance(client, redis.RedisCluster):
        # A cluster's pipeline refuses CONFIG GET; a plain call asks the default node.
        for name in CHECKED:
            found.update(client.config_get(name))
        return found
    pipe = client.pipeline(transaction=False)
    for name in CHECKED:
        pipe.config_get(name)
    for reply in pipe.execute():
        found.update(reply)
    return found


def assess(config: dict[str, str], *, claim_replicas: int = 0) -> DurabilityReport:
    """The risks of one configuration (pure: tested without a server)."""
    risks = []
    if config.get("appendonly", "").lower() != "yes":
        risks.append(
            "appendonly is no, so a restart goes back to the last RDB snapshot and forgets "
            "every claim made since"
        )
    else:
        fsync = config.get("appendfsync", "").lower()
        if fsync == "no":
            risks.append(
                "appendfsync is no, so a machine crash loses the claims the OS had not yet "
                "written (up to about 30 s)"
            )
        elif fsync == "everysec" and claim_replicas < 1:
            risks.append(
                "appendfsync is everysec, so a machine crash loses up to about a second of "
                "claims (use always, or claim_replicas >= 1 so a replica holds each claim)"
            )
    policy = config.get("maxmemory-policy", "noeviction").lower()
    if policy.startswith("allkeys-") and config.get("maxmemory", "0") not in ("", "0"):
        risks.append(
            f"maxmemory-policy is {policy}, so a full Redis evicts ledger keys and queued "
            "messages (use noeviction)"
        )
    shown = tuple((name, config[name]) for name in CHECKED if name in config)
    if risks:
        return DurabilityReport(Verdict.AT_RISK, shown, tuple(risks))
    return DurabilityReport(Verdict.DURABLE, shown)


def check(client: redis.Redis, *, claim_replicas: int = 0) -> DurabilityReport:
    """Read and assess; a refused `CONFIG` is a report, never an exception."""
    try:
        config = read_config(client)
    except redis.ResponseError as e:  # renamed or disabled command, or an ACL refusal
        return DurabilityReport(Verdict.UNCHECKED, unreadable=str(e).splitlines()[0][:200])
    return assess(config, claim_replicas=claim_replicas)


def check_at_start(
    client: redis.Redis, *, where: str, require: bool, claim_replicas: int, component: str
) -> DurabilityReport:
    """The startup check of one process: log one line, or raise `UnsafeRedis` if required.

    `where` is the Redis URL without its password; `component` names the process in the line
    (worker, beat, sweep).
    """
    report = check(client, claim_replicas=claim_replicas)
    text = f"{component}: {report.message(where)}"
    if report.verdict is Verdict.DURABLE:
        log.info("%s", text)
        return report
    if require:
        raise UnsafeRedis(f"{text} ({REQUIRE_ENV} is set, so {component} does not start)")
    log.warning("%s", text)
    return report
