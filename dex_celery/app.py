"""`Dex`: binds tools, settings, the ledger and the store to one Celery app.

One object per deployment, created where the Celery app is (see `config/celery_app.py`): the
façade users see (tool registration, clients, outcome checks, beat schedule). The components
doing the work are built once per process in a `Runtime` (`dex_celery.runtime`), each handed
only its collaborators, and dropped in a forked child by the one after-fork hook.
"""

from __future__ import annotations

import logging
import threading
import weakref
from collections.abc import Callable, Mapping
from types import MappingProxyType
from typing import TYPE_CHECKING, Any

import redis
from billiard.exceptions import WorkerLostError
from celery import Celery, signals

from dex_celery import hooks
from dex_celery.arguments import prepare_tool
from dex_celery.beat_jobs import install_beat_jobs
from dex_celery.client import DexClient
from dex_celery.consumer import CELERY_CONSUMER, DEX_CONSUMER, guard_closed_channels
from dex_celery.definitions import tool_definitions
from dex_celery.dispatch import Dispatcher
from dex_celery.errors import ConfigurationError, DuplicateTool
from dex_celery.events import AgentEvents
from dex_celery.forks import after_fork
from dex_celery.health import install_worker_checks
from dex_celery.ledger.connection import broker_transport_options
from dex_celery.ledger.keys import KeySpace
from dex_celery.ledger.ledger import Ledger
from dex_celery.policy import ToolPolicy, check_registration, effect_from_annotations
from dex_celery.reconcile import (
    RECONCILE_TASK,
    AnyOutcomeCheck,
    OutcomeChecks,
    reconcile_once,
)
from dex_celery.runtime import Runtime
from dex_celery.settings import Settings
from dex_celery.startup import install as install_startup_hooks
from dex_celery.store.repository import Store
from dex_celery.sweep import Sweeper
from dex_celery.task_events import AttemptFailed
from dex_celery.tools import TASK_PREFIX, Tool, ToolFunction, find_tool

if TYPE_CHECKING:
    from dex_celery.reconcile import _F

log = logging.getLogger("dex_celery")

#: Celery task name of one sweep. Beat no longer schedules it (it runs the sweeper in a thread,
#: `dex_celery.startup`); kept registered so schedules written for earlier versions still work.
SWEEP_TASK = "dex.sweep"


def configure_celery(app: Celery, settings: Settings) -> None:
    """The Celery options dex-celery relies on (docs/ledger.md, "Celery options by class").

    JSON only (S9.2); results live in the ledger and SQL, not in a result backend; task events
    for Flower (`Settings.task_events`); one message prefetched per process so a long tool does
    not hold others back. A worker whose broker link breaks keeps reconnecting for as long as
    it takes, at start and later, and running tools go on meanwhile (their ledger lease and
    claim fence them, not the broker); its consumer survives Kombu's teardown of the lost link
    (`dex_celery.consumer`, docs/operations.md).
    """
    app.conf.update(
        task_serializer="json",
        result_serializer="json",
        accept_content=["json"],
        event_serializer="json",
        task_ignore_result=True,
        worker_prefetch_multiplier=1,
        worker_send_task_events=settings.task_events,
        task_send_sent_event=settings.task_events,
        broker_connection_retry_on_startup=True,
        broker_connection_retry=True,
        broker_connection_max_retries=None,
        worker_cancel_long_running_tasks_on_connection_loss=False,
    )
    if app.conf.worker_consumer == CELERY_CONSUMER:
        app.conf.worker_consumer = DEX_CONSUMER
    guard_closed_channels()
    if not app.conf.broker_url or app.conf.broker_url.startswith("amqp://guest@localhost"):
        app.conf.broker_url = settings.effective_broker_url
    # A `sentinel://` broker needs the master's name (Kombu's transport option).
    sentinel_options = broker_transport_options(settings)
    if sentinel_options:
        app.conf.broker_transport_options = {
            **sentinel_options,
            **(app.conf.broker_transport_options or {}),
        }


#: The `Dex` created on each Celery app, so `-A proj.celery:app` finds it (`dex_of`).
_DEX_OF_APP: weakref.WeakKeyDictionary[Celery, Dex] = weakref.WeakKeyDictionary()


def dex_of(celery: Celery) -> Dex | None:
    """The `Dex` bound to a Celery app (the last one created on it), or None."""
    return _DEX_OF_APP.get(celery)


class Dex:
    """The registry of tools of one Celery app and the services they are recorded in."""

    def __init__(self, celery: Celery, settings: Settings | None = None) -> None:
        self.celery = celery
        self.settings = settings or Settings.from_env()
        self.keys = KeySpace(self.settings.key_prefix)
        # SQL times (requests, deadlines, outcomes) come from the ledger's clock, Redis's (S10.1).
        self.store = Store(
            self.settings.database_url,
            schema=self.settings.database_schema,
            clock=lambda: self.ledger.now(),
        )
        self._tools: dict[str, Tool] = {}
        #: This process's components (`runtime`), built on first use, dropped after a fork.
        self._runtime: Runtime | None = None
        self._lock = threading.Lock()
        after_fork(self._forget_runtime)
        configure_celery(celery, self.settings)
        _DEX_OF_APP[celery] = self
        self._register_sweep_task()
        #: Outcome checks of tools, read by the reconcile beat job (S8.4, `dex_celery.reconcile`).
        self.outcome_checks = OutcomeChecks()
        self._register_reconcile_task()
        # Startup checks of Redis (worker, beat) and the sweeper thread of beat.
        install_startup_hooks(self)
        #: Set by `beat_schedule(reconcile_interval=...)`; the beat process's reconcile loop.
        self._reconcile_interval: float | None = None
        install_beat_jobs(
            self, lambda: self._reconcile_interval or self.settings.reconcile_interval
        )
        signals.task_failure.connect(self._on_task_failure, weak=False)
        install_worker_checks(self)
        signals.worker_process_shutdown.connect(self._flush_outcomes, weak=False)
        signals.worker_shutdown.connect(self._flush_outcomes, weak=False)
        hooks.connect(self)  # worker metrics port, beat's webhook sender (if configured)

    # --- tools ---------------------------------------------------------------------------------

    def tool(
        self,
        name: str | None = None,
        *,
        policy: ToolPolicy | None = None,
        annotations: Mapping[str, Any] | None = None,
    ) -> Callable[[ToolFunction], ToolFunction]:
        """Register a function as a tool: `fn(ctx: ToolContext, **arguments) -> JSON value`.

        The Celery task is `dex.tool.<name>`. Configuration errors (S1.6) raise here, at import.
        """

        def register(fn: ToolFunction) -> ToolFunction:
            tool = Tool(
                name=name or fn.__name__,
                function=fn,
                policy=policy or ToolPolicy(),
                annotations=MappingProxyType(dict(annotations or {})),
                description=(fn.__doc__ or "").strip(),
            )
            self.add_tool(tool)
            return fn

        return register

    def add_tool(self, tool: Tool) -> None:
        """Register a `Tool` built by hand (what `tool()` does for a decorated function)."""
        check_registration(tool.name, tool.policy, tool.annotations)
        tool = prepare_tool(tool)  # arguments schema, secret names (dex_celery/arguments.py)
        if tool.name in self._tools:
            raise DuplicateTool(f"a tool named {tool.name!r} is registered already")
        self._tools[tool.name] = tool
        effect = tool.policy.effect or effect_from_annotations(tool.annotations)
        # Late ack only where a redelivered message is harmless; a tool whose class depends on
        # the session default is treated as a write here (the ledger still retries reads).
        late_ack = effect is not None and effect.retryable

        def execute(
            key: str, attempt: int, arguments: str | dict[str, Any], sealed: str | None = None
        ) -> str | None:
            return self.runtime.worker.run(tool, key, attempt, arguments, sealed)

        execute.__name__ = execute.__qualname__ = tool.name
        execute.__doc__ = tool.description
        # shared=False: tasks belong to this Celery app only, not to every app in the process.
        self.celery.task(
            name=tool.task_name,
            shared=False,
            acks_late=late_ack,
            reject_on_worker_lost=False,
            ignore_result=True,
            typing=False,
            # An ended call is an expected outcome: logged in one line, no traceback.
            throws=(AttemptFailed,),
        )(execute)

    def add_mcp_server(self, name: str | None = None, **options: Any) -> list[Tool]:
        """Register the tools of an MCP server (stdio `command=[...]` or streamable-HTTP
        `url=...`); see `dex_celery.integrations.mcp_client.add_mcp_server` for the options."""
        try:
            # Deferred: the `mcp` extra is optional; the core imports without it.
            from dex_celery.integrations.mcp_client import add_mcp_server
        except ImportError as e:
            raise ConfigurationError(
                f"add_mcp_server needs the mcp extra: pip install 'dex-celery[mcp]' ({e})"
            ) from e
        return add_mcp_server(self, name, **options)

    def get_tool(self, name: str) -> Tool:
        """The registered tool `name`; `UnknownTool` if there is none."""
        return find_tool(self._tools, name)

    @property
    def tools(self) -> Mapping[str, Tool]:
        """Every registered tool by name (read-only)."""
        return MappingProxyType(self._tools)

    def tool_definitions(self, format: str = "openai") -> list[dict[str, Any]]:
        """Every tool's schema as `openai`, `anthropic` or `mcp` tool definitions."""
        return tool_definitions(self._tools.values(), format)

    # --- per-process services ------------------------------------------------------------------

    @property
    def runtime(self) -> Runtime:
        """This process's components, built once on first use (again in a forked child)."""
        runtime = self._runtime
        if runtime is None:
            with self._lock:
                runtime = self._runtime
                if runtime is None:
                    runtime = Runtime(
                        self.celery, self.settings, self.keys, self.store, self.tools
                    )
                    self._runtime = runtime
        return runtime

    def _forget_runtime(self) -> None:
        """After a fork (`dex_celery.forks`): the child builds its own connections and threads."""
        self._lock = threading.Lock()
        self._runtime = None

    @property
    def ledger(self) -> Ledger:
        """This process's ledger (Redis)."""
        return self.runtime.ledger

    @property
    def redis(self) -> redis.Redis:
        """This process's Redis client of the ledger, for what is not a ledger script."""
        return self.runtime.redis

    @property
    def events(self) -> AgentEvents:
        """The AgentEvents stream of this deployment."""
        return self.runtime.events

    def epoch(self, *, refresh: bool = False) -> str:
        """This ledger's life id (see `KeySpace.epoch`; `dex_celery.epoch.LedgerEpoch`)."""
        return self.runtime.epoch.current(refresh=refresh)

    @property
    def dispatcher(self) -> Dispatcher:
        """This process's dispatcher (built once, with the runtime)."""
        return self.runtime.dispatcher

    @property
    def sweeper(self) -> Sweeper:
        """This process's sweeper (built once, with the runtime)."""
        return self.runtime.sweeper

    def client(self) -> DexClient:
        """A `DexClient` over this deployment (cheap; make one where needed)."""
        return DexClient(self)

    # --- Celery wiring -------------------------------------------------------------------------

    def beat_schedule(
        self, *, reconcile_interval: float | None = None
    ) -> dict[str, dict[str, Any]]:
        """What to put in `app.conf.beat_schedule`: nothing any more, and that is the point.

        Both of dex-celery's periodic jobs run inside the beat process, each in a thread of its
        own: the sweeper every `sweep_interval` (`dex_celery.startup`), so detection never waits
        in the tools' queue for a free slot, and the reconcile job (S8.4) every
        `reconcile_interval` (`dex_celery.beat_jobs`), so it never fills Flower's task list.
        Kept so deployments that assign it keep working; `reconcile_interval` given here
        overrides the setting.
        """
        if reconcile_interval is not None:
            self._reconcile_interval = reconcile_interval
        return {}

    # --- outcome checks (S8; dex_celery/reconcile.py) -------------------------------------------

    def outcome_check(self, tool_name: str) -> Callable[[_F], _F]:
        """Decorator: `check(key, arguments_json) -> report text | CannotTellYet`, sync or async."""
        return self.outcome_checks.decorator(tool_name)

    def register_outcome_check(self, tool_name: str, check: AnyOutcomeCheck) -> None:
        """`outcome_check` without the decorator: `check(key, arguments_json)`."""
        self.outcome_checks.register(tool_name, check)

    def _register_reconcile_task(self) -> None:
        def reconcile() -> dict[str, int]:
            return reconcile_once(self).as_dict()

        # No task events: a run by hand (`celery call dex.reconcile`) stays out of Flower too.
        self.celery.task(
            name=RECONCILE_TASK,
            ignore_result=True,
            acks_late=False,
            shared=False,
            send_events=False,
        )(reconcile)

    def _register_sweep_task(self) -> None:
        def sweep() -> dict[str, int]:
            return self.sweeper.sweep_once().as_dict()

        self.celery.task(name=SWEEP_TASK, ignore_result=True, acks_late=False, shared=False)(sweep)

    def _on_task_failure(
        self,
        sender: Any = None,
        task_id: str | None = None,
        exception: BaseException | None = None,
        **_: Any,
    ) -> None:
        """The fast path for a pool child that died while its parent lives (docs/ledger.md, crash table).

        Celery's parent process reports `WorkerLostError` through `task_failure` when the message
        was not requeued; the attempt is marked lost now instead of when its lease lapses.
        """
        if sender is None or task_id is None or getattr(sender, "app", None) is not self.celery:
            return
        if not str(getattr(sender, "name", "")).startswith(TASK_PREFIX):
            return
        if not isinstance(exception, WorkerLostError):
            return
        self.runtime.worker.on_worker_lost(task_id, str(exception))

    def _flush_outcomes(self, **_: Any) -> None:
        """Write the outcomes this process still holds before it exits (the sweeper would,
        later)."""
        runtime = self._runtime
        if runtime is not None and not runtime.writer.flush():
            log.warning("outcomes still unwritten at shutdown; the sweeper will record them")

