"""The components of one process, built together once and handed only what each needs.

`Dex` builds a `Runtime` on first use in each process and drops it in a forked child (the one
after-fork hook, `dex_celery.forks`), so a prefork child never shares its parent's sockets or
threads. Who calls whom (docs/architecture.md):

    Steps(celery, ledger, store, settings)                      ledger steps -> actions, publish
    Opener(celery, ledger, store, epoch, steps, settings)       open and publish attempt 1
    Dispatcher(tools, opener)                                   requests -> records
    Sweeper(ledger, store, steps, opener, settings, epoch)      what stopped moving
    Worker(celery, ledger, store, steps, settings, writer)      one attempt in a task
    OutcomeWriter(store, ledger)                                batched SQL writes of outcomes
    (forward: a prefork pool process's outcomes to its main process's writer, `OutcomeChannel`;
    gate: shut when the worker's warm shutdown begins, `ShutdownGate`)
    Approvals(store, ledger, epoch, opener, tools, settings)    a person's decisions
    WriteFreezeControl(store, ledger, opener, tools)            the write freeze (S13.2)
    Reconciler(store, events, checks, settings)                 outcome_unknown calls (S8)
    Retention(store, ledger, settings)                          bounded history (S12.4)

It imports the rooms through their faces (`request/`, `attempt/`, `upkeep/`); no room imports
it.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Protocol

from celery import Celery

from dex_celery.engine.attempt import OutcomeWriter, ShutdownGate, Worker
from dex_celery.engine.epoch import LedgerEpoch
from dex_celery.engine.request import Approvals, Dispatcher, Opener
from dex_celery.engine.steps import Steps
from dex_celery.engine.upkeep import (
    OutcomeChecks,
    Reconciler,
    Retention,
    Sweeper,
    WriteFreezeControl,
)
from dex_celery.ledger.connection import ledger_client
from dex_celery.ledger.guard import ledger_location
from dex_celery.ledger.keys import KeySpace
from dex_celery.ledger.ledger import Ledger
from dex_celery.model.budgets import charges_of_json
from dex_celery.model.records import ToolCallRecord
from dex_celery.settings import Settings
from dex_celery.store.repository import Store
from dex_celery.store.values import OutcomeRow
from dex_celery.tools.tool import Tool


class Runtime:
    """This process's ledger connection and the components wired to it.

    Also holds what it was built from (the Celery app, settings, key space, store, tools,
    outcome checks), so the process wiring and the operators' side take a `Runtime` and never
    the façade.
    """

    def __init__(
        self,
        celery: Celery,
        settings: Settings,
        keys: KeySpace,
        store: Store,
        tools: Mapping[str, Tool],
        checks: OutcomeChecks,
        forward: Callable[[OutcomeRow], bool] | None = None,
        gate: ShutdownGate | None = None,
    ) -> None:
        self.celery = celery
        self.settings = settings
        self.keys = keys
        self.store = store
        self.tools = tools
        self.checks = checks
        self.ledger = Ledger(
            ledger_client(settings),
            keys=keys,
            events_maxlen=settings.events_maxlen,
            finished_ttl=settings.finished_ttl,
        )
        location = ledger_location(
            settings.redis_url, settings.key_prefix, settings.redis_sentinel_master
        )
        #: The ledger's Redis client, for what is not a ledger script (events, stats, hooks).
        self.redis = self.ledger.client
        self.events = self.ledger.events
        self.epoch = LedgerEpoch(self.ledger, lambda: store.engine, location)
        self.steps = Steps(celery, self.ledger, store, settings)
        self.opener = Opener(celery, self.ledger, store, self.epoch, self.steps, settings)
        self.dispatcher = Dispatcher(tools, self.opener)
        self.sweeper = Sweeper(self.ledger, store, self.steps, self.opener, settings, self.epoch)
        self.writer = OutcomeWriter(store, self.ledger)
        self.freeze = WriteFreezeControl(store, self.ledger, self.opener, tools)
        self.worker = Worker(
            celery,
            self.ledger,
            store,
            self.steps,
            settings,
            self.writer,
            forward,
            gate,
            on_frozen=self.freeze.on_frozen,
        )
        self.approvals = Approvals(store, self.ledger, self.epoch, self.opener, tools, settings)
        self.reconciler = Reconciler(store, self.events, checks, settings, self._settle_budgets)
        self.retention = Retention(store, self.ledger, settings)

    def _settle_budgets(self, record: ToolCallRecord, went_through: bool) -> None:
        """Reconciliation said what became of `record`: settle its held budgets (S13.1)."""
        scopes = [
            self.ledger.keys.budget(c.name, c.scope_id) for c in charges_of_json(record.budgets)
        ]
        self.ledger.settle_budgets(record.key, scopes, went_through=went_through)


class RuntimeSource(Protocol):
    """Whatever builds this process's `Runtime` on first use (a `Dex`).

    What long-lived objects hold instead of the façade: they ask for `runtime` when they act, so
    in a forked child they get the child's runtime, never the parent's sockets.
    """

    @property
    def settings(self) -> Settings:
        """The deployment's settings (read without building the runtime)."""
        ...

    @property
    def runtime(self) -> Runtime: ...

    @property
    def built_runtime(self) -> Runtime | None:
        """The runtime if this process built one already (shutdown hooks must not build one)."""
        ...
