"""MCP servers' tools as dex tools: `dex.add_mcp_server(...)`.

`add_mcp_server` connects once to the server (a stdio command or a streamable-HTTP URL), lists
its tools and registers each as a dex tool. A tool's effect class comes from its MCP
annotations, read with MCP's own defaults for missing hints (`readOnlyHint` false,
`destructiveHint` true, `idempotentHint` false, `openWorldHint` true), unless a `ToolPolicy`
given here says otherwise (S1.4), and only for a server marked `trust="annotations"`: by
default a server is untrusted and its hints decide nothing (`McpTrust`). A write marked
`destructiveHint: true` waits for approval by default (S1.3, `policy.approval_by_default`). The tool's `inputSchema` becomes the request-time argument
check. The list is read when the process registers its tools, so a change on the server is
picked up when workers (and requesters) restart.

Each attempt uses this worker process's warm session of the server (`mcp_sessions`: one per
server and process, reused, replaced when it breaks) and sends `tools/call` with the call's
idempotency key in the request's `_meta` under `IDEMPOTENCY_META_KEY` (MCP has no standard key
for it): a server can deduplicate on it. What can go wrong maps onto dex's outcomes:

| what happened                                              | attempt ends as | the call        |
|------------------------------------------------------------|-----------------|-----------------|
| the server could not be reached or refused the handshake   | retryable       | retried (read, idempotent write), else `failed`, "did not run" |
| the server answered with an error (`isError`, JSON-RPC)    | tool error      | `failed` with the server's text |
| the connection broke after `tools/call` was sent (the server died, timed out, dropped it) | lost (`ToolLost`) | retried (read, idempotent write), else a read is `failed` and a write `outcome_unknown` (S4.3) |
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import json
import logging
import shlex
from collections.abc import AsyncIterator, Coroutine, Mapping, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass, field, replace
from enum import StrEnum
from types import MappingProxyType
from typing import Any, Protocol, TypeVar, cast

import anyio
import httpx2
import mcp_types
from mcp import Client, MCPError, StdioServerParameters
from mcp.client.streamable_http import streamable_http_client

from dex_celery.errors import (
    ConfigurationError,
    DuplicateTool,
    RetryableToolError,
    ToolError,
    ToolLost,
)
from dex_celery.integrations.mcp_sessions import pool
from dex_celery.model.outcomes import DID_NOT_RUN
from dex_celery.model.policy import ToolPolicy, check_registration
from dex_celery.tools.schema import check_schema
from dex_celery.tools.tool import Tool, ToolContext

log = logging.getLogger("dex_celery.mcp")

#: The `_meta` key of every `tools/call` a worker sends: the call's idempotency key
#: (`session/turn/call`, the same for every attempt, S2.1). Vendor-prefixed, since MCP has no
#: standard key for it; `dex-celery mcp` reads the same key to take a caller's ids.
IDEMPOTENCY_META_KEY = "dex-celery/idempotency-key"
#: The `_meta` key carrying the attempt number (1, 2, ...), for the server's logs.
ATTEMPT_META_KEY = "dex-celery/attempt"

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
        if self.url is not None:
            if self.headers:
                return Client(_http_transport(self.url, dict(self.headers)))
            return Client(self.url)
        params = StdioServerParameters(
            command=self.command[0], args=list(self.command[1:]), env=dict(self.env), cwd=self.cwd
        )
        return Client(params)


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

    def add_tool(self, tool: Tool) -> None: ...


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
) -> list[Tool]:
    """List the server's tools and register each as a dex tool named `<prefix><tool name>`.

    The server is a stdio `command` (a list, or a string split like a shell would, plus `args`)
    or a streamable-HTTP `url` (with `headers` on every request); `name` (for messages and logs) defaults to the name the server
    gives itself. `policies` (by the server's tool name) and then `policy` (for every tool) beat
    the tool's annotations (S1.4). `trust` says whether the annotations are believed at all
    (`McpTrust`: untrusted by default, then every tool is `unclassified` unless a policy says
    otherwise). `tools` keeps only the named tools. A server that cannot be listed is logged
    and registers no tool (the process goes on with every other tool), unless `required=True`,
    which raises `ConfigurationError` as below. A server that cannot be
    listed, a named tool it does not have, an invalid input schema, a name taken already or a
    policy refused by S1.6 raise `ConfigurationError` here, and then no tool is registered.
    """
    if isinstance(command, str):
        command = shlex.split(command)
    trusted = McpTrust.parse(trust) is McpTrust.ANNOTATIONS
    server = McpServer(
        name=name or "mcp",
        command=(*(command or ()), *args),
        url=url,
        env=MappingProxyType(dict(env or {})),
        cwd=cwd,
        connect_timeout=connect_timeout,
        headers=MappingProxyType(dict(headers or {})),
    )
    try:
        server_name, listed = run_sync(_list_tools(server))
    except Exception as e:
        error = ConfigurationError(
            f"cannot list the tools of MCP server {server.name!r} ({server.where}): {_describe(e)}"
        )
        if required:
            raise error from e
        # One unreachable server must not stop the process (a worker, the CLI) from serving
        # every other tool: its tools are simply not registered here, so a request for one is
        # refused with the typed unknown-tool error, and nothing else is affected.
        log.warning("%s; its tools are not registered in this process", error)
        return []
    if name is None and server_name:
        server = replace(server, name=server_name)
    wanted = set(tools) if tools is not None else None
    unknown = sorted((wanted or set()) - {t.name for t in listed})
    unknown += sorted(set(policies or {}) - {t.name for t in listed})
    if unknown:
        raise ConfigurationError(
            f"MCP server {server.name!r} has no tool named {', '.join(map(repr, unknown))} "
            f"(it lists: {', '.join(t.name for t in listed) or 'none'})"
        )
    prepared = [
        _dex_tool(
            server,
            listed_tool,
            prefix,
            (policies or {}).get(listed_tool.name) or policy,
            trusted=trusted,
        )
        for listed_tool in listed
        if wanted is None or listed_tool.name in wanted
    ]
    # Everything is checked before the first tool is registered: all or nothing.
    for tool in prepared:
        if tool.name in dex.tools:
            raise DuplicateTool(
                f"MCP server {server.name!r}: a tool named {tool.name!r} is registered already "
                "(use prefix=... to keep the server's tools apart)"
            )
        check_registration(tool.name, tool.policy, tool.annotations)
    for tool in prepared:
        dex.add_tool(tool)
    log.info("MCP server %s: registered %d tools", server.name, len(prepared))
    return prepared


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
    session of the server (`mcp_sessions`), opened by the first attempt that needs it."""

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
        session = sessions.current(server)
        try:
            result = await client.call_tool(self.tool_name, arguments, meta=meta)
        except asyncio.CancelledError:
            raise
        except MCPError as error:
            if error.code in (mcp_types.CONNECTION_CLOSED, mcp_types.REQUEST_TIMEOUT):
                sessions.discard(server, session)
                raise self._lost(error) from error
            # The server answered: it refused the request (unknown tool, bad params, ...).
            raise ToolError(
                f"MCP server {server.name!r} refused the call of {self.tool_name!r}: "
                f"{error.message}"
            ) from error
        except Exception as e:
            # From here on the server may have acted on the call: the attempt is lost.
            sessions.discard(server, session)
            raise self._lost(e) from e
        return self._value(result)

    def _unreachable(self, e: BaseException) -> RetryableToolError:
        return RetryableToolError(
            f"{DID_NOT_RUN}: MCP server {self.server.name!r} ({self.server.where}) could not be "
            f"reached, so {self.tool_name!r} was not called ({_describe(e)})"
        )

    def _lost(self, e: BaseException) -> ToolLost:
        return ToolLost(
            f"the connection to MCP server {self.server.name!r} broke after {self.tool_name!r} "
            f"was called ({_describe(e)}); the tool may or may not have run"
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


def _json_or_text(text: str) -> Any:
    try:
        value = json.loads(text)
    except ValueError:
        return text
    return value if isinstance(value, dict | list) else text


def _describe(e: BaseException) -> str:
    """One line for an error that may be an exception group from the SDK's task groups."""
    if isinstance(e, BaseExceptionGroup):
        return "; ".join(_describe(inner) for inner in e.exceptions)
    if isinstance(e, MCPError):
        return f"MCP error {e.code}: {e.message}"
    text = str(e)
    return f"{type(e).__name__}: {text}" if text else type(e).__name__


def run_sync(coroutine: Coroutine[Any, Any, _T]) -> _T:
    """Run a coroutine from synchronous code, also when the calling thread has a running loop
    (then in a fresh thread, so the caller's loop is never re-entered)."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(coroutine)
    with concurrent.futures.ThreadPoolExecutor(max_workers=1) as pool:
        return pool.submit(asyncio.run, coroutine).result()
