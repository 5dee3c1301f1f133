"""`Dex`: binds tools, settings, the ledger and the store to one Celery app.

One object per deployment, created where the Celery app is (see `config/celery_app.py`): the
façade users see (tool registration, clients, outcome checks, beat schedule). The components
doing the work are built once per process in a `Runtime` (`dex_celery.engine.runtime`), each handed
only its collaborators, and dropped in a forked child by the one after-fork hook.
"""

from __future__ import annotations

import logging
import threading
import weakref
from collections.abc import Callable, Mapping
from types import MappingProxyType
from typing import TYPE_CHECKING, Any, TypeVar

import redis
from celery import Celery

from dex_celery.audit.keys import load_signer
from dex_celery.backend_errors import translating_backend_errors
from dex_celery.client.dex_client import DexClient
from dex_celery.engine import (
    RECONCILE_TASK,
    AnyOutcomeCheck,
    Approvals,
    AttemptFailed,
    Dispatcher,
    OutcomeChecks,
    Reconciler,
    Runtime,
    Sweeper,
    WriteFreezeControl,
    check_preview,
    reconcile_once,
    register_preview_task,
)
from dex_celery.errors import ConfigurationError, DuplicateTool
from dex_celery.forks import after_fork, keep_inherited
from dex_celery.ledger.events import AgentEvents
from dex_celery.ledger.keys import KeySpace
from dex_celery.ledger.ledger import Ledger
from dex_celery.model.policy import ToolPolicy, check_registration
from dex_celery.processes.beat import connect_beat
from dex_celery.processes.celery_config import configure_celery
from dex_celery.processes.worker import connect_worker
from dex_celery.settings import Settings
from dex_celery.store.repository import Store
from dex_celery.tools.arguments import prepare_tool
from dex_celery.tools.catalog import ToolCatalog, ToolSource
from dex_celery.tools.definitions import tool_definitions
from dex_celery.tools.tool import PreviewFunction, Tool, ToolFunction, find_tool

if TYPE_CHECKING:
    from dex_celery.integrations.mcp.client import McpServerTools

log = logging.getLogger("dex_celery")

#: An outcome check as registered, returned unchanged by `Dex.outcome_check`.
_F = TypeVar("_F", bound=AnyOutcomeCheck)


#: The `Dex` created on each Celery app, so `-A proj.celery:app` finds it (`dex_of`).
_DEX_OF_APP: weakref.WeakKeyDictionary[Celery, Dex] = weakref.WeakKeyDictionary()


def dex_of(celery: Celery) -> Dex | None:
    """The `Dex` bound to a Celery app (the last one created on it), or None."""
    return _DEX_OF_APP.get(celery)


@translating_backend_errors
class Dex:
    """The registry of tools of one Celery app and the services they are recorded in."""

    def __init__(self, celery: Celery, settings: Settings | None = None) -> None:
        self.celery = celery
        # Without settings given: the app's `dex_*` configuration, the environment over it.
        self.settings = settings or Settings.from_app(celery.conf)
        self.keys = KeySpace(
            self.settings.key_prefix,
            shards=self.settings.ledger_shards,
            tagged=self.settings.ledger_cluster,
        )
        # SQL times (requests, deadlines, outcomes) come from the ledger's clock, Redis's (S10.1).
        self.store = Store(
            self.settings.database_url,
            schema=self.settings.database_schema,
            clock=lambda: self.ledger.now(),
            signer=load_signer(self.settings.audit_key, self.settings.audit_key_file),
        )
        #: Registered tools; MCP servers add sources that register theirs on demand.
        self._tools = ToolCatalog()
        #: This process's components (`runtime`), built on first use, dropped after a fork.
        self._runtime: Runtime | None = None
        self._lock = threading.Lock()
        after_fork(self._forget_runtime)
        configure_celery(celery, self.settings)
        _DEX_OF_APP[celery] = self
        #: Outcome checks of tools, read by the reconcile beat job (S8.4, `dex_celery.engine.upkeep.reconcile`).
        self.outcome_checks = OutcomeChecks()
        self._register_reconcile_task()
        register_preview_task(celery, lambda: self.runtime)
        #: Set by `beat_schedule(reconcile_interval=...)`; the beat process's reconcile loop.
        self._reconcile_interval: float | None = None
        #: Every Celery signal, one place per process role (`dex_celery/processes/`).
        self.worker_services = connect_worker(
            celery, self, self._tools.refresh_sources, self._tools.close_sources
        )
        connect_beat(
            celery, self, lambda: self._reconcile_interval or self.settings.reconcile_interval
        )

    # --- tools ---------------------------------------------------------------------------------

    def tool(
        self,
        name: str | None = None,
        *,
        policy: ToolPolicy | None = None,
        annotations: Mapping[str, Any] | None = None,
        preview: PreviewFunction | None = None,
    ) -> Callable[[ToolFunction], ToolFunction]:
        """Register a function as a tool: `fn(ctx: ToolContext, **arguments) -> JSON value`.

        The Celery task is `dex.tool.<name>`. Configuration errors (S1.6) raise here, at import.
        `preview`: a read-only function of the same arguments returning short text, shown
        wherever the call waits for approval (docs/guardrails.md, "Previews").
        """

        def register(fn: ToolFunction) -> ToolFunction:
            tool = Tool(
                name=name or fn.__name__,
                function=fn,
                policy=policy or ToolPolicy(),
                annotations=MappingProxyType(dict(annotations or {})),
                description=(fn.__doc__ or "").strip(),
                preview=preview,
            )
            self.add_tool(tool)
            return fn

        return register

    def add_tool(self, tool: Tool) -> None:
        """Register a `Tool` built by hand (what `tool()` does for a decorated function)."""
        check_registration(tool.name, tool.policy, tool.annotations)
        tool = prepare_tool(tool)  # arguments schema, secret names (dex_celery/tools/arguments.py)
        check_preview(tool)
        if tool.name in self._tools:
            raise DuplicateTool(f"a tool named {tool.name!r} is registered already")
        self._tools[tool.name] = tool

        def execute(
            key: str,
            attempt: int,
            arguments: str | dict[str, Any],
            sealed: str | None = None,
            approved: bool = False,
        ) -> str | None:
            # The message's defaults are the task's (above); the worker is told them outright.
            return self.runtime.worker.run(
                tool, key, attempt, arguments, sealed=sealed, approved=approved
            )

        execute.__name__ = execute.__qualname__ = tool.name
        execute.__doc__ = tool.description
        # shared=False: tasks belong to this Celery app only, not to every app in the process.
        # Every tool task is acknowledged late, whatever the tool's class: a running attempt's
        # message then counts against the worker's prefetch, so a worker never holds a call it
        # has no free slot for (docs/ledger.md, "Celery options"), and a message delivered but
        # never claimed (a warm shutdown hands it back) goes to another worker. A redelivered
        # copy is harmless: its claim is refused (S3.2, S3.3).
        self.celery.task(
            name=tool.task_name,
            shared=False,
            acks_late=True,
            reject_on_worker_lost=False,
            ignore_result=True,
            typing=False,
            # An ended call is an expected outcome: logged in one line, no traceback.
            throws=(AttemptFailed,),
        )(execute)

    def add_mcp_server(self, name: str | None = None, **options: Any) -> McpServerTools:
        """Register an MCP server (stdio `command=[...]` or streamable-HTTP `url=...`); its
        tools are registered when first needed, and nothing connects here. See
        `dex_celery.integrations.mcp.client.add_mcp_server` for the options."""
        try:
            # Deferred: the `mcp` extra is optional; the core imports without it.
            from dex_celery.integrations.mcp.client import add_mcp_server
        except ImportError as e:
            raise ConfigurationError(
                f"add_mcp_server needs the mcp extra: pip install 'dex-celery[mcp]' ({e})"
            ) from e
        return add_mcp_server(self, name, **options)

    def add_tool_source(self, source: ToolSource) -> None:
        """A source of tools registered on demand (`tools/catalog.py`; an MCP server)."""
        self._tools.sources.append(source)

    @property
    def tool_sources(self) -> list[ToolSource]:
        """The sources added with `add_tool_source` (the MCP servers)."""
        return list(self._tools.sources)

    def get_tool(self, name: str) -> Tool:
        """The registered tool `name`; `UnknownTool` if there is none."""
        return find_tool(self._tools, name)

    @property
    def tools(self) -> Mapping[str, Tool]:
        """Every registered tool by name (read-only)."""
        return MappingProxyType(self._tools)

    def tool_definitions(self, format: str = "openai") -> list[dict[str, Any]]:
        """Every tool's schema as `openai`, `anthropic` or `mcp` tool definitions (an MCP
        server's tools from its kept list, fetched first if never kept; a server that cannot be
        reached and was never listed is left out, with a warning in the log)."""
        for error in self._tools.provide_all():
            log.warning("%s", error)
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
                        self.celery,
                        self.settings,
                        self.keys,
                        self.store,
                        self._tools,  # the catalog itself: lookups reach the MCP sources
                        self.outcome_checks,
                        forward=self.worker_services.forward_outcome,
                        gate=self.worker_services.shutdown.gate,
                    )
                    self._runtime = runtime
        return runtime

    @property
    def built_runtime(self) -> Runtime | None:
        """This process's components if built already (None in a fresh child)."""
        return self._runtime

    def _forget_runtime(self) -> None:
        """After a fork (`dex_celery.forks`): the child builds its own connections and threads."""
        self._lock = threading.Lock()
        keep_inherited(self._runtime)
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
        """This ledger's life id (see `KeySpace.epoch`; `dex_celery.engine.epoch.LedgerEpoch`)."""
        return self.runtime.epoch.current(refresh=refresh)

    @property
    def dispatcher(self) -> Dispatcher:
        """This process's dispatcher (built once, with the runtime)."""
        return self.runtime.dispatcher

    @property
    def approvals(self) -> Approvals:
        """This process's approvals (built once, with the runtime)."""
        return self.runtime.approvals

    @property
    def writes(self) -> WriteFreezeControl:
        """This process's write freeze: freeze, thaw, status (S13.2, docs/guardrails.md)."""
        return self.runtime.freeze

    @property
    def reconciler(self) -> Reconciler:
        """This process's reconciler of `outcome_unknown` calls (built once, with the runtime)."""
        return self.runtime.reconciler

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

        dex-celery's periodic jobs run inside the beat process, each in a thread of its
        own (`dex_celery.processes.beat`): the sweeper every `sweep_interval`, so detection never waits
        in the tools' queue for a free slot, and the reconcile job (S8.4) every
        `reconcile_interval`, so it never fills Flower's task list; with `retention` set, the
        retention job (S12.4) every `retention_interval`. Assigning it says in the
        Celery configuration that beat runs this deployment's periodic work;
        `reconcile_interval` given here overrides the setting.
        """
        if reconcile_interval is not None:
            self._reconcile_interval = reconcile_interval
        return {}

    # --- outcome checks (S8; dex_celery/engine/upkeep/reconcile.py) -------------------------------

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
            # Late, as every task of the app: a running job holds its slot's prefetch (a rerun
            # after a redelivery reports nothing twice, S8.2).
            acks_late=True,
            shared=False,
            send_events=False,
        )(reconcile)
