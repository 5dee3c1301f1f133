"""`dex-celery dev` restarts a worker, beat or Flower whose main process exits.

A worker's main process can end for reasons outside the ledger's reach (a library fault on a
lost broker link, the OOM killer, a stray `kill`); with nothing to start it again, calls wait
until their attempts expire. The production definitions restart it (docker-compose.yml's
`restart: unless-stopped`, the systemd units in `config/systemd/`); this is the same promise for
the development stack: each restart is announced on one line, after a delay that doubles with
each exit in a row (bounded by `Backoff.maximum`) and starts over once a process has run for
`Backoff.stable_after` seconds.

The private redis-server is not restarted: it keeps no data, so a new one would be a ledger that
forgot every call in flight; `dev` stops the stack and says so instead.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field

from dex_celery.processes.localstack import Echo, LocalStack, Service

#: The services `dev` restarts when they exit.
RESTARTED = frozenset({"worker", "beat", "flower"})


@dataclass(frozen=True, slots=True)
class Backoff:
    """How long to wait before starting an exited process again."""

    initial: float = 1.0
    maximum: float = 30.0
    #: A process that ran at least this long before it exited counts as healthy: the next
    #: delay is `initial` again.
    stable_after: float = 60.0

    def delay(self, exits_in_a_row: int) -> float:
        """The delay after the `exits_in_a_row`-th exit in a row (1, 2, ...)."""
        return float(min(self.maximum, self.initial * 2 ** max(0, exits_in_a_row - 1)))


@dataclass(slots=True)
class Restarts:
    """What the supervisor knows of one service's exits."""

    count: int = 0
    in_a_row: int = 0
    #: When the pending restart is due (monotonic clock); None: none pending.
    due: float | None = None


@dataclass
class Supervisor:
    """Polled by `dev`'s loop: restarts what may be restarted, returns what may not."""

    stack: LocalStack
    backoff: Backoff = field(default_factory=Backoff)
    echo: Echo = print
    clock: Callable[[], float] = time.monotonic
    restarts: dict[str, Restarts] = field(default_factory=dict)
    #: When each service (by name) was last started, on `clock`.
    started_at: dict[str, float] = field(default_factory=dict)

    def watch(self) -> None:
        """Note the start time of every service the stack runs now."""
        now = self.clock()
        for service in self.stack.services:
            self.started_at.setdefault(service.name, now)

    def poll(self) -> list[Service]:
        """Schedule or make due restarts; the exited services that are not restarted."""
        fatal: list[Service] = []
        now = self.clock()
        for service in list(self.stack.services):
            if service.alive():
                continue
            if service.name not in RESTARTED:
                fatal.append(service)
                continue
            state = self.restarts.setdefault(service.name, Restarts())
            if state.due is None:
                self._schedule(service, state, now)
            elif now >= state.due:
                self._restart(service, state)
        return fatal

    def _schedule(self, service: Service, state: Restarts, now: float) -> None:
        ran = now - self.started_at.get(service.name, now)
        state.in_a_row = 1 if ran >= self.backoff.stable_after else state.in_a_row + 1
        delay = self.backoff.delay(state.in_a_row)
        state.due = now + delay
        self.echo(
            f"{service.name} (pid {service.pid}) exited with code {service.process.returncode} "
            f"after {ran:.0f}s; restarting it in {delay:g}s (restart {state.count + 1})"
        )

    def _restart(self, service: Service, state: Restarts) -> None:
        fresh = self.stack.respawn(service)
        state.count += 1
        state.due = None
        self.started_at[service.name] = self.clock()
        self.echo(f"restarted {service.name}: pid {fresh.pid} (restart {state.count})")
