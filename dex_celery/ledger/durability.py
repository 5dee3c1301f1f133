"""Durable claims: a claim counts only once `claim_replicas` replicas hold it (Redis `WAIT`).

Replication is asynchronous: a primary that dies right after acknowledging a claim may be
replaced by a replica that never saw it, and the promoted ledger then says the attempt never
reached a worker (S10.2). With `claim_replicas = N > 0` the worker, after its claim and before
any tool code, waits up to `claim_replicas_timeout` for N replicas to acknowledge it.

This narrows the window; it does not close it. Redis's own documentation says so: `WAIT` makes
a lost claim much less likely (the promoted replica is one that holds it, if Sentinel picks one
of the N), but a failover can still promote a replica without it, and a claim that reached the
replicas can still be lost by a replica restarted without persistence. Rollback detection
stays the final safety; this only makes it rarer.

`WAIT` counts the writes of the connection that sends it; redis-py takes any connection of its
pool for each command, so the claim's own connection cannot be relied on. The worker therefore
sends `PUBLISH` (propagated to replicas like a write, and no key is touched) and `WAIT` together
on one connection: the replication stream is ordered, so replicas that acknowledged the
`PUBLISH`, sent after the claim returned, hold the claim too.

When fewer than N replicas answer in time, the tool does not run. The attempt ends as a
retryable failure whose text starts with "the tool did not run, so it is safe to call again":
true, since no tool code ran in it. A read or idempotent write with attempts left is retried;
a write ends `failed` with that text, never as something that ran. Claims refused this way show
that replication is behind or a replica is down; the log line says how many replicas answered.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING

import redis

from dex_celery.model.outcomes import DID_NOT_RUN

if TYPE_CHECKING:
    from dex_celery.settings import Settings

log = logging.getLogger("dex_celery.durability")

#: Suffix of the channel the replication probe is published on (nobody subscribes to it).
PROBE_CHANNEL = "claim-replication-probe"


@dataclass(frozen=True, slots=True)
class ReplicaShortfall:
    """Fewer replicas than required held the claim in time (or Redis could not be asked)."""

    wanted: int
    acked: int
    timeout: float
    error: str = ""

    @property
    def reason(self) -> str:
        if self.error:
            return (
                f"Redis could not confirm that {self.wanted} replica(s) hold its claim "
                f"({self.error})"
            )
        return (
            f"its claim was held by {self.acked} of the {self.wanted} Redis replica(s) required "
            f"within {self.timeout:g}s (claim_replicas)"
        )

    @property
    def detail(self) -> str:
        """The error the attempt ends with (the model reads it on a call that failed)."""
        return (
            f"{DID_NOT_RUN}: {self.reason}, so the worker gave the attempt up before any tool "
            "code ran"
        )


def wait_for_replicas(
    client: redis.Redis, *, channel: str, replicas: int, timeout: float
) -> ReplicaShortfall | None:
    """Wait until `replicas` replicas hold every write acknowledged before this call.

    None when they do (or when no replica is asked for); a `ReplicaShortfall` otherwise.
    """
    if replicas <= 0:
        return None
    try:
        pipe = client.pipeline(transaction=False)
        pipe.publish(channel, "1")
        pipe.wait(replicas, max(1, int(timeout * 1000)))
        acked = int(pipe.execute()[1])
    except redis.RedisError as e:
        return ReplicaShortfall(replicas, 0, timeout, error=f"{type(e).__name__}: {e}")
    if acked >= replicas:
        return None
    return ReplicaShortfall(replicas, acked, timeout)


def claim_shortfall(client: redis.Redis, settings: Settings, key: str, attempt: int) -> str | None:
    """Called by the worker right after a successful claim: None when the claim counts,
    otherwise the error text the attempt must end with, the tool not having run."""
    if settings.claim_replicas <= 0:
        return None  # the option is off: the primary's claim counts, no round trip
    shortfall = wait_for_replicas(
        client,
        channel=f"{settings.key_prefix}:{PROBE_CHANNEL}",
        replicas=settings.claim_replicas,
        timeout=settings.claim_replicas_timeout,
    )
    if shortfall is None:
        return None
    log.warning("attempt %d of %s not run: %s", attempt, key, shortfall.reason)
    return shortfall.detail
