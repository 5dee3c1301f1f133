"""MCP servers' tools as dex tools: `dex.add_mcp_server(...)`.

`add_mcp_server` connects to nothing: it adds the server as a tool source (`McpServerTools`,
`tools/catalog.py`). The server's tool list is fetched by the first process that needs it (a
worker at start, a request for one of its tools while no list was ever kept,
`dex-celery mcp-servers refresh`, a `notifications/tools/list_changed` on a session) and kept in
the database (`store/mcp_catalog.py`), where every other process reads it, so requesters, the
CLI and the web app start no server process. A tool's effect class comes from its MCP
annotations, read with MCP's own defaults for missing hints (`readOnlyHint` false,
`destructiveHint` true, `idempotentHint` false, `openWorldHint` true), unless a `ToolPolicy`
given here says otherwise (S1.4), and only for a server marked `trust="annotations"`: by
default a server is untrusted and its hints decide nothing (`McpTrust`). A write marked
`destructiveHint: true` waits for approval by default (S1.3, `policy.approval_by_default`). A
tool whose definition digest differs from the one accepted waits for approval on every call
until a person accepts it (`Tool.approval_gate`, docs/semantics.md S1.7). The tool's
`inputSchema` becomes the request-time argument check.

Each attempt uses this worker process's warm session of the server (`mcp/sessions`: one per
server and process, reused, replaced when it breaks) and sends `tools/call` with the call's
idempotency key in the request's `_meta` under `IDEMPOTENCY_META_KEY` (MCP has no standard key
for it): a server can deduplicate on it. What can go wrong maps onto dex's outcomes:

| what happened                                              | attempt ends as | the call        |
|------------------------------------------------------------|-----------------|-----------------|
| the server could not be reached or refused the handshake   | retryable       | retried (read, idempotent write), else `failed`, "did not run" |
| the server answered with an error (`isError`, JSON-RPC)    | tool error      | `failed` with the server's text |
| the connection broke after `tools/call` was sent (the server died, timed out, dropped it) | lost (`ToolLost`) | retried (read, idempotent write), else a read is `failed` and a write `outcome_unknown` (S4.3) |

A server that advertises the outcome extension (`dex-celery/outcome`,
docs/mcp-outcome-extension.md; `dex-celery mcp` does) says itself whether the call ran, and treats a
re-sent key as the same call, so its answers replace those guesses (`settle`):

| the server's `_meta["dex-celery/outcome"]` | attempt ends as |
|--------------------------------------------|-----------------|
| `executed`                                  | the result, or a tool error if `isError` |
| `not_executed`                              | retryable, "did not run" (S4.2): nothing took effect |
| `unknown`                                   | lost (`ToolLost`): a write becomes `outcome_unknown` |
| `pending`                                   | the same key is sent again after `pollIntervalMs` until it says more |
| absent or unknown to this revision          | the rules of the table above |

and a connection that broke after `tools/call` was sent is opened again and the same key re-sent
(`RESENDS` times): the answer is the same call's outcome, never a second run. Only if no answer
comes back is the attempt lost.

A server that advertises the tasks extension (`TASKS_EXTENSION`) gets the call as a task,
followed by `mcp/remote_task` (polled, asked for again by its id after a broken connection,
cancelled shortly before the attempt's time limit).
"""

from __future__ import annotations

import asyncio
import json
import logging
import shlex
import threading
import time
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass, field, replace
from enum import StrEnum
from types import MappingProxyType
from typing import Any, Protocol, TypeVar, cast

import anyio
import httpx2
import mcp_types
from mcp import Client, MCPError, StdioServerParameters
from mcp.client.extension import advertise
from mcp.client.streamable_http import streamable_http_client

from dex_celery.async_bridge import run_sync
from dex_celery.errors import (
    ConfigurationError,
    DexError,
    DuplicateTool,
    McpServerUnavailable,
    RetryableToolError,
    ToolError,
    ToolLost,
)
from dex_celery.integrations.mcp.outcome import (
    OUTCOME_EXTENSION,
    Outcome,
    advertised,
    outcome_in,
)
from dex_celery.integrations.mcp.sessions import pool
from dex_celery.integrations.mcp.task_call import tasks_extension
from dex_celery.integrations.mcp.wire import (
    ATTEMPT_META_KEY,
    IDEMPOTENCY_META_KEY,
    RESEND_BACKOFF,
    RESENDS,
    TASKS_EXTENSION,
    connection_broke,
    describe,
    result_texts,
)
from dex_celery.ledger.events import AgentEvents
from dex_celery.model.event_types import EventType
from dex_celery.model.outcomes import DID_NOT_RUN
from dex_celery.model.policy import ToolPolicy, check_registration
from dex_celery.store.mcp_catalog import McpCatalog, McpServerState, McpToolDefinition
from dex_celery.store.repository import Store
from dex_celery.tools.catalog import ToolSource
from dex_celery.tools.schema import check_schema
from dex_celery.tools.tool import Tool, ToolContext

log = logging.getLogger("dex_celery.mcp")

#: MCP's defaults for hints a tool leaves out (the `ToolAnnotations` schema documents them).
MCP_DEFAULT_HINTS: Mapping[str, bool] = MappingProxyType(
    {"readOnlyHint": False, "destructiveHint": True, "idempotentHint": False, "openWorldHint": True}
)

_T = TypeVar("_T")


class McpTrust(StrEnum):
    """How far a server's own tool annotations are believed (the MCP specification: clients
    must treat annotations from untrusted servers as untrusted).

    `annotations`: the hints decide each tool's effect class (S1.4), as for dex's own tools.
    `untrusted` (the default): the hints decide nothing; every tool is `unclassified` (one
    attempt, approval required, S1.3) unless a `ToolPolicy` or the session's default says
    otherwise. The hints are still kept, under `UNTRUSTED_HINTS_KEY`, for people to read.
    """

    ANNOTATIONS = "annotations"
    UNTRUSTED = "untrusted"

    @classmethod
    def parse(cls, value: McpTrust | str) -> McpTrust:
        try:
            return cls(value)
        except ValueError as e:
            allowed = ", ".join(c.value for c in cls)
            raise ConfigurationError(
                f"unknown MCP trust {value!r}; expected one of: {allowed}"
            ) from e


#: Where an untrusted server's hints are kept in a tool's annotations (read by nothing that
#: decides: `effect_from_annotations` looks at the hint keys only).
UNTRUSTED_HINTS_KEY = "dex-celery/untrusted-hints"

#: The MCP SDK's own HTTP timeouts (connect/write/pool, and read: a response stream may idle).
_HTTP_TIMEOUT = 30.0
_HTTP_READ_TIMEOUT = 300.0


@dataclass(frozen=True, slots=True)
class McpServer:
    """Where an MCP server is: a stdio command (started per connection) or a streamable-HTTP URL.

    `env` is added to the MCP SDK's minimal default environment of a stdio server (the worker's
    own environment, with its database and Redis URLs, is not passed on). `headers` go with
    every HTTP request (an `Authorization` header, say); they are kept out of `repr`.
    """

    name: str
    command: tuple[str, ...] = ()
    url: str | None = None
    env: Mapping[str, str] = field(default_factory=lambda: MappingProxyType({}))
    cwd: str | None = None
    connect_timeout: float = 30.0
    headers: Mapping[str, str] = field(default_factory=lambda: MappingProxyType({}), repr=False)
    #: Called when the server sends `notifications/tools/list_changed` on a session.
    on_tools_changed: Callable[[], None] | None = field(default=None, compare=False, repr=False)

    def __post_init__(self) -> None:
        if bool(self.command) == bool(self.url):
            raise ConfigurationError(
                f"MCP server {self.name!r}: give exactly one of command=[...] (stdio) or url=... "
                "(streamable HTTP)"
            )
        if isinstance(self.command, str):
            raise ConfigurationError(
                f"MCP server {self.name!r}: command must be a list of arguments, not a string"
            )

    @property
    def where(self) -> str:
        return self.url or " ".join(self.command)

    def client(self) -> Client:
        # Declared to every server: one that advertises the outcome extension answers with it,
        # one that advertises the tasks extension may answer a call with a task
        # (`mcp/remote_task` follows it); any other server ignores both.
        options: dict[str, Any] = {
            "message_handler": self._on_message,
            "extensions": [advertise(OUTCOME_EXTENSION), tasks_extension()],
        }
        if self.url is not None:
            if self.headers:
                return Client(_http_transport(self.url, dict(self.headers)), **options)
            return Client(self.url, **options)
        params = StdioServerParameters(
            command=self.command[0], args=list(self.command[1:]), env=dict(self.env), cwd=self.cwd
        )
        return Client(params, **options)

    async def _on_message(self, message: Any) -> None:
        if isinstance(message, mcp_types.ToolListChangedNotification) and self.on_tools_changed:
            self.on_tools_changed()
        await anyio.lowlevel.checkpoint()


@asynccontextmanager
async def _http_transport(url: str, headers: dict[str, str]) -> AsyncIterator[Any]:
    """Streamable HTTP with extra headers, on an HTTP client closed with the connection."""
    timeout = httpx2.Timeout(_HTTP_TIMEOUT, read=_HTTP_READ_TIMEOUT)
    async with (
        httpx2.AsyncClient(headers=headers, timeout=timeout) as http,
        streamable_http_client(url, http_client=http) as streams,
    ):
        yield streams


def hints_with_defaults(annotations: mcp_types.ToolAnnotations | None) -> dict[str, Any]:
    """The tool's annotations as MCP defines them: every hint present, missing ones defaulted."""
    given = annotations.model_dump(by_alias=True, exclude_none=True) if annotations else {}
    return {**MCP_DEFAULT_HINTS, **given}


class ToolRegistry(Protocol):
    """Where the server's tools are registered (a `Dex`)."""

    @property
    def tools(self) -> Mapping[str, Tool]: ...

    @property
    def store(self) -> Store: ...

    @property
    def events(self) -> AgentEvents: ...

    def add_tool(self, tool: Tool) -> None: ...

    def add_tool_source(self, source: ToolSource) -> None: ...


#: Seconds a requester waits after a failed fetch of a never-listed server before a request
#: for a tool that may be its tries to reach it again (a dead server costs each request nothing).
RETRY_FETCH_AFTER = 10.0


def add_mcp_server(
    dex: ToolRegistry,
    name: str | None = None,
    *,
    command: Sequence[str] | str | None = None,
    args: Sequence[str] = (),
    url: str | None = None,
    headers: Mapping[str, str] | None = None,
    env: Mapping[str, str] | None = None,
    cwd: str | None = None,
    prefix: str = "",
    policy: ToolPolicy | None = None,
    policies: Mapping[str, ToolPolicy] | None = None,
    tools: Sequence[str] | None = None,
    connect_timeout: float = 30.0,
    trust: McpTrust | str = McpTrust.UNTRUSTED,
    required: bool = False,
) -> McpServerTools:
    """Register an MCP server whose tools become dex tools named `<prefix><tool name>`.

    Nothing connects here: the server's tool list is read by the first process that needs it
    (a worker at start, a request for one of its tools, `dex-celery mcp-servers refresh`) and
    kept in the database (`store/mcp_catalog.py`), where every other process reads it.

    The server is a stdio `command` (a list, or a string split like a shell would, plus `args`)
    or a streamable-HTTP `url` (with `headers` on every request); `name` keys its kept list and
    is shown by the CLI (default: the command's program or the URL). `policies` (by the
    server's tool name) and then `policy` (for every tool) beat the tool's annotations (S1.4).
    `trust` says whether the annotations are believed at all (`McpTrust`: untrusted by default,
    then every tool is `unclassified` unless a policy says otherwise). `tools` keeps only the
    named tools. `required=True` reads the list now and raises `ConfigurationError` if the
    server cannot be listed. A named tool the server does not have, an invalid input schema, a
    name taken already or a policy refused by S1.6 raise `ConfigurationError` when the list is
    first registered in a process (a worker logs it and goes on without the server's tools).
    """
    if isinstance(command, str):
        command = shlex.split(command)
    trusted = McpTrust.parse(trust) is McpTrust.ANNOTATIONS
    full = (*(command or ()), *args)
    server = McpServer(
        name=name or _default_name(full, url),
        command=full,
        url=url,
        env=MappingProxyType(dict(env or {})),
        cwd=cwd,
        connect_timeout=connect_timeout,
        headers=MappingProxyType(dict(headers or {})),
    )
    source = McpServerTools(
        dex,
        server,
        prefix=prefix,
        policy=policy,
        policies=MappingProxyType(dict(policies or {})),
        only=frozenset(tools) if tools is not None else None,
        trusted=trusted,
    )
    if any(getattr(s, "name", None) == server.name for s in getattr(dex, "tool_sources", ())):
        raise ConfigurationError(f"an MCP server named {server.name!r} is registered already")
    if required:
        source.fetch()
    dex.add_tool_source(source)
    return source


def _default_name(command: Sequence[str], url: str | None) -> str:
    if url is not None:
        return url
    words = [w for w in command if not w.startswith("-")]
    return words[-1].rsplit("/", 1)[-1] if words else "mcp"


def definition_of(listed: mcp_types.Tool) -> McpToolDefinition:
    """What is kept of a listed tool (and digested: any change asks a person again)."""
    annotations = (
        listed.annotations.model_dump(by_alias=True, exclude_none=True)
        if listed.annotations is not None
        else None
    )
    return McpToolDefinition.of(
        listed.name,
        listed.description or listed.title or "",
        dict(listed.input_schema),
        annotations,
    )


def _listed(definition: McpToolDefinition) -> mcp_types.Tool:
    annotations = (
        mcp_types.ToolAnnotations.model_validate(dict(definition.annotations))
        if definition.annotations is not None
        else None
    )
    return mcp_types.Tool(
        name=definition.name,
        description=definition.description or None,
        input_schema=dict(definition.input_schema),
        annotations=annotations,
    )


class McpListFailed(ConfigurationError):
    """The server could not be listed (not reached, refused the handshake, timed out)."""


class McpServerTools:
    """One registered MCP server as a tool source (`tools/catalog.py`): its tools are
    registered in this process from the list kept in the database, which is fetched from the
    server only by a worker's start, `refresh()`, a `notifications/tools/list_changed`, or a
    request for a tool that may be its while no list was ever kept."""

    def __init__(
        self,
        dex: ToolRegistry,
        server: McpServer,
        *,
        prefix: str,
        policy: ToolPolicy | None,
        policies: Mapping[str, ToolPolicy],
        only: frozenset[str] | None,
        trusted: bool,
    ) -> None:
        self.dex = dex
        self.server = replace(server, on_tools_changed=self._tools_changed)
        self.prefix = prefix
        self.policy = policy
        self.policies = policies
        self.only = only
        self.trusted = trusted
        self._lock = threading.RLock()

    @property
    def name(self) -> str:
        return self.server.name

    @property
    def catalog(self) -> McpCatalog:
        return McpCatalog(self.dex.store)

    def state(self) -> McpServerState | None:
        """The kept list, its time and last error (None: never fetched nor tried)."""
        return self.catalog.servers([self.name]).get(self.name)

    def tools(self) -> list[Tool]:
        """This server's tools, registered in this process (fetched first if never kept);
        `McpServerUnavailable` if no list was ever kept and the server cannot be reached."""
        error = self.provide(None)
        if error is not None:
            raise error
        return [t for t in self.dex.tools.values() if self._owns(t)]

    # --- ToolSource ----------------------------------------------------------------------------

    def provide(self, tool_name: str | None) -> DexError | None:
        if tool_name is not None and not self._may_be_mine(tool_name):
            return None
        with self._lock:
            state = self.state()
            if state is not None and state.tools is not None:
                self._register(state.tools)
                return None
            if (
                state is not None
                and state.last_error_at is not None
                and time.time() - state.last_error_at < RETRY_FETCH_AFTER
            ):
                return self._unavailable(state.last_error or "")
            try:
                self.fetch()
            except McpListFailed as e:
                if isinstance(e.__cause__, DexError):
                    raise e.__cause__ from None  # the database, not the server
                return self._unavailable(str(e))
        return None

    def claims(self, tool_name: str) -> bool:
        """Only a server with a prefix or an `only` list can tell its names from a typo."""
        return bool(self.prefix or self.only is not None) and self._may_be_mine(tool_name)

    def refresh(self) -> None:
        """Fetch the list anew; if the server cannot be reached, register the kept list (if
        any) and go on: one dead server never stops a worker (its calls then end "did not run"
        when no session can be opened)."""
        try:
            self.fetch()
            return
        except Exception as e:
            log.warning("MCP server %s: %s", self.name, e)
        try:
            state = self.state()
            if state is not None and state.tools is not None:
                self._register(state.tools)
        except Exception as e:
            log.warning("MCP server %s: its kept tool list is not usable: %s", self.name, e)

    def close(self) -> None:
        """Close this process's warm MCP sessions (a worker process's shutdown): each server
        sees its session end (a stdio server's stdin closed, an HTTP session's `DELETE`). The
        pool is the process's, so the first source closes every server's session."""
        pool().close_all()

    # --- fetching ------------------------------------------------------------------------------

    def fetch(self) -> tuple[McpToolDefinition, ...]:
        """Connect, list the tools, keep the list (announcing changed definitions) and register
        them here. `ConfigurationError` if the server cannot be listed (the error is kept)."""
        with self._lock:
            try:
                _server_name, listed = run_sync(_list_tools(self.server))
            except Exception as e:
                error = McpListFailed(
                    f"cannot list the tools of MCP server {self.name!r} ({self.server.where}): "
                    f"{describe(e)}"
                )
                try:
                    self.catalog.save_error(self.name, self.server.where, str(error))
                except DexError as db_error:
                    raise error from db_error
                raise error from e
            definitions = tuple(definition_of(t) for t in listed)
            # Registered first: a database that cannot keep the list does not stop this process
            # from knowing the tools (their calls then find the database themselves).
            self._register(definitions)
            changed = self.catalog.save_tools(self.name, self.server.where, definitions)
            self._announce(changed, definitions)
            return definitions

    def _tools_changed(self) -> None:
        """`notifications/tools/list_changed` from a warm session: read the list anew, off the
        session's loop."""
        threading.Thread(target=self.refresh, name=f"mcp-refresh-{self.name}", daemon=True).start()

    def _announce(self, changed: Sequence[str], definitions: Sequence[McpToolDefinition]) -> None:
        if not changed:
            return
        digests = {d.name: d.digest for d in definitions}
        log.warning(
            "MCP server %s: the definition of %s changed; calls wait for approval until a person "
            "accepts it (dex-celery mcp-servers accept %s)",
            self.name,
            ", ".join(changed),
            self.name,
        )
        try:
            for tool in changed:
                self.dex.events.publish(
                    EventType.MCP_TOOL_DEFINITION_CHANGED,
                    "",
                    server=self.name,
                    tool=tool,
                    digest=digests[tool],
                )
        except DexError as e:  # the change is kept in SQL; the event is only its announcement
            log.warning(
                "MCP server %s: the changed-definition event was not sent: %s", self.name, e
            )

    # --- registering ---------------------------------------------------------------------------

    def _may_be_mine(self, tool_name: str) -> bool:
        if not tool_name.startswith(self.prefix):
            return False
        return self.only is None or tool_name[len(self.prefix) :] in self.only

    def _owns(self, tool: Tool) -> bool:
        function = tool.function
        return isinstance(function, McpToolFunction) and function.server.name == self.name

    def _register(self, definitions: Sequence[McpToolDefinition]) -> None:
        names = {d.name for d in definitions}
        unknown = sorted((self.only or set()) - names) + sorted(set(self.policies) - names)
        if unknown:
            raise ConfigurationError(
                f"MCP server {self.name!r} has no tool named {', '.join(map(repr, unknown))} "
                f"(it lists: {', '.join(sorted(names)) or 'none'})"
            )
        prepared = []
        for definition in definitions:
            if self.only is not None and definition.name not in self.only:
                continue
            registered = self.dex.tools.get(self.prefix + definition.name)
            if registered is not None and self._owns(registered):
                continue  # registered here already (a new definition waits on its gate)
            tool = _dex_tool(
                self.server,
                _listed(definition),
                self.prefix,
                self.policies.get(definition.name) or self.policy,
                trusted=self.trusted,
            )
            gate = _pin_gate(self.catalog, self.name, definition.name)
            prepared.append(replace(tool, approval_gate=gate))
        # Everything is checked before the first tool is registered: all or nothing.
        for tool in prepared:
            if tool.name in self.dex.tools:
                raise DuplicateTool(
                    f"MCP server {self.name!r}: a tool named {tool.name!r} is registered already "
                    "(use prefix=... to keep the server's tools apart)"
                )
            check_registration(tool.name, tool.policy, tool.annotations)
        for tool in prepared:
            self.dex.add_tool(tool)
        if prepared:
            log.info("MCP server %s: registered %d tools", self.name, len(prepared))

    def _unavailable(self, why: str) -> McpServerUnavailable:
        return McpServerUnavailable(
            f"the tool list of MCP server {self.name!r} has never been fetched and the server "
            f"cannot be reached ({why}); ask again once it is up "
            f"(dex-celery mcp-servers refresh {self.name})",
            self.name,
        )


def _pin_gate(catalog: McpCatalog, server: str, tool: str) -> Callable[[], str | None]:
    def gate() -> str | None:
        digest = catalog.changed_digest(server, tool)
        if digest is None:
            return None
        return (
            f"the definition of MCP tool {tool!r} of server {server!r} changed since it was "
            f"accepted (now {digest[:12]})"
        )

    return gate


def _dex_tool(
    server: McpServer,
    listed: mcp_types.Tool,
    prefix: str,
    policy: ToolPolicy | None,
    *,
    trusted: bool,
) -> Tool:
    tool_name = prefix + listed.name
    schema = dict(listed.input_schema)
    check_schema(tool_name, schema)
    hints = hints_with_defaults(listed.annotations)
    if not trusted:
        own = {k: v for k, v in hints.items() if k not in MCP_DEFAULT_HINTS}
        hints = {**own, UNTRUSTED_HINTS_KEY: dict(hints)}
    return Tool(
        name=tool_name,
        function=McpToolFunction(server, listed.name),
        policy=policy or ToolPolicy(),
        annotations=MappingProxyType(hints),
        description=listed.description or listed.title or "",
        input_schema=MappingProxyType(schema),
    )


async def _list_tools(server: McpServer) -> tuple[str, list[mcp_types.Tool]]:
    """The server's own name and every tool it lists, page by page."""
    found: list[mcp_types.Tool] = []
    with anyio.fail_after(server.connect_timeout):
        async with server.client() as client:
            info = client.server_info
            cursor: str | None = None
            while True:
                page = await client.list_tools(cursor=cursor)
                found.extend(page.tools)
                cursor = page.next_cursor
                if cursor is None:
                    return (info.name if info is not None else ""), found
    raise AssertionError("unreachable")  # pragma: no cover


class McpToolFunction:
    """The body of one MCP tool on a worker: one `tools/call` per attempt, on this process's warm
    session of the server (`mcp/sessions`), opened by the first attempt that needs it."""

    def __init__(self, server: McpServer, tool_name: str) -> None:
        self.server = server
        self.tool_name = tool_name
        self.__name__ = tool_name
        self.__doc__ = f"MCP tool {tool_name!r} of server {server.name!r}"

    def __call__(self, ctx: ToolContext, **arguments: Any) -> Any:
        # Prefork's soft time limit (start-to-close, S5.1) lands in this waiting thread and
        # cancels the call; a fenced attempt cancels it through `ctx`.
        return pool().run(self.call(ctx, arguments), ctx.on_cancel)

    async def call(self, ctx: ToolContext, arguments: dict[str, Any]) -> Any:
        # `_meta` is an open map; the vendor keys are extra items of the TypedDict.
        meta = cast(
            mcp_types.RequestParamsMeta,
            {IDEMPOTENCY_META_KEY: ctx.idempotency_key, ATTEMPT_META_KEY: ctx.attempt},
        )
        server, sessions = self.server, pool()
        try:
            # Nothing is sent until the session answers (a warm one its ping, a new one the
            # handshake), so failing here means the tool was not called.
            client = await sessions.session(server)
        except asyncio.CancelledError:
            raise
        except Exception as e:
            raise self._unreachable(e) from e
        extensions = client.server_capabilities.extensions
        if isinstance(extensions, Mapping) and TASKS_EXTENSION in extensions:
            # Deferred: remote_task.py names this module's McpToolFunction as its function's type.
            from dex_celery.integrations.mcp.remote_task import RemoteTaskCall

            follow = RemoteTaskCall(self, ctx, client, arguments, meta, advertised(extensions))
            return await follow.run()
        if advertised(extensions):
            return await self._call_with_outcome(client, arguments, meta)
        session = sessions.current(server)
        try:
            result = await client.call_tool(self.tool_name, arguments, meta=meta)
        except MCPError as error:  # (a cancellation is no MCPError nor Exception: it passes)
            if connection_broke(error):
                sessions.discard(server, session)
                raise self._lost(error) from error
            # The server answered: it refused the request (unknown tool, bad params, ...).
            raise self._refused(error) from error
        except Exception as e:
            # From here on the server may have acted on the call: the attempt is lost.
            sessions.discard(server, session)
            raise self._lost(e) from e
        return self._value(result)

    # --- servers of the outcome extension (docs/mcp-outcome-extension.md) ---------------------

    async def _call_with_outcome(
        self, client: Client, arguments: dict[str, Any], meta: mcp_types.RequestParamsMeta
    ) -> Any:
        """One attempt on a server that states outcomes and keeps a key one call: a broken
        connection is opened again and the key re-sent; a `pending` answer is asked again."""
        server, sessions = self.server, pool()
        broken: BaseException | None = None
        resends = 0
        while True:
            session = sessions.current(server)
            try:
                result = await client.call_tool(self.tool_name, arguments, meta=meta)
            except asyncio.CancelledError:
                raise
            except MCPError as error:
                if not connection_broke(error):
                    raise self._error_outcome(error) from error
                sessions.discard(server, session)
                broken = error
            except Exception as e:
                sessions.discard(server, session)
                broken = e
            else:
                broken = None
                outcome = outcome_in(result.meta)
                if outcome is not Outcome.PENDING:
                    return self._settle(result, outcome)
                await anyio.sleep(_poll_interval(result.meta))
            while True:
                if broken is not None:
                    # The server may have acted on it: only its answer to the key can say.
                    resends += 1
                    if resends > RESENDS:
                        raise self._lost(broken) from broken
                    log.info(
                        "MCP server %s: the connection broke during %s (%s); sending its key again",
                        server.name,
                        meta.get(IDEMPOTENCY_META_KEY),
                        describe(broken),
                    )
                    await anyio.sleep(min(RESEND_BACKOFF * 2 ** (resends - 1), 2.0))
                try:
                    client = await sessions.session(server)
                    break
                except asyncio.CancelledError:
                    raise
                except Exception as e:
                    broken = broken or e

    def _settle(self, result: mcp_types.CallToolResult, outcome: Outcome | None) -> Any:
        """The attempt's end from the outcome the server stated (None: it stated none)."""
        if outcome is Outcome.NOT_EXECUTED:
            raise RetryableToolError(
                f"{DID_NOT_RUN}: MCP server {self.server.name!r} says {self.tool_name!r} was not "
                f"executed ({result_texts(result) or 'no reason given'})"
            )
        if outcome is Outcome.UNKNOWN:
            raise ToolLost(
                f"MCP server {self.server.name!r} says the outcome of {self.tool_name!r} is "
                f"unknown: it may or may not have taken effect ({result_texts(result)})"
            )
        return self._value(result)

    def _error_outcome(self, error: MCPError) -> DexError:
        """A JSON-RPC error of a server of the extension: its `data` may state the outcome."""
        data = error.error.data if isinstance(error.error.data, Mapping) else None
        outcome = outcome_in(data)
        if outcome is Outcome.UNKNOWN:
            return ToolLost(
                f"MCP server {self.server.name!r} answered {self.tool_name!r} with an error and "
                f"says its outcome is unknown: {error.message}"
            )
        if outcome is Outcome.EXECUTED:
            return ToolError(f"MCP server {self.server.name!r}: {error.message}")
        # `not_executed`, or no outcome: a JSON-RPC error refuses the request before it runs.
        return self._refused(error)

    def _refused(self, error: MCPError) -> ToolError:
        return ToolError(
            f"MCP server {self.server.name!r} refused the call of {self.tool_name!r}: "
            f"{error.message}"
        )

    def _unreachable(self, e: BaseException) -> RetryableToolError:
        return RetryableToolError(
            f"{DID_NOT_RUN}: MCP server {self.server.name!r} ({self.server.where}) could not be "
            f"reached, so {self.tool_name!r} was not called ({describe(e)})"
        )

    def _lost(self, e: BaseException) -> ToolLost:
        return ToolLost(
            f"the connection to MCP server {self.server.name!r} broke after {self.tool_name!r} "
            f"was called ({describe(e)}); the tool may or may not have run"
        )

    def _value(self, result: mcp_types.CallToolResult | None) -> Any:
        """The record's result: structured content if any, else the one text block (the object
        or list it holds if it is JSON text, as servers send unstructured results), else the
        content blocks."""
        if result is None:  # pragma: no cover - call_tool returns or raises
            raise ToolLost(f"MCP server {self.server.name!r} gave no answer")
        texts = [block.text for block in result.content if isinstance(block, mcp_types.TextContent)]
        if result.is_error:
            raise ToolError("\n".join(texts) or f"MCP tool {self.tool_name!r} reported an error")
        if result.structured_content is not None:
            return result.structured_content
        if len(texts) == len(result.content) == 1:
            return _json_or_text(texts[0])
        return [
            block.model_dump(mode="json", by_alias=True, exclude_none=True)
            for block in result.content
        ]


#: Seconds between two sends of a key whose call the server says is `pending`, unless its answer
#: asks for another interval (`_meta["pollIntervalMs"]`).
PENDING_POLL = 1.0


def _poll_interval(meta: Mapping[str, Any] | None) -> float:
    given = (meta or {}).get("pollIntervalMs")
    if isinstance(given, int | float) and 0 < given <= 60_000:
        return float(given) / 1000
    return PENDING_POLL


def _json_or_text(text: str) -> Any:
    try:
        value = json.loads(text)
    except ValueError:
        return text
    return value if isinstance(value, dict | list) else text
