"""MCP tool lists kept in SQL: `dex_mcp_servers` and `dex_mcp_tool_pins`.

A registered MCP server's tool list is fetched by the first process that needs it (a worker at
start, a request for one of its tools, `dex-celery mcp-servers refresh`) and kept here with the
time it was fetched, so every other process (requesters, the CLI, the web app) reads it without
starting a server process. Each definition carries a digest (`definition_digest`); the digest a
person accepted is pinned per tool, the first one seen accepted on first use. A tool whose
current digest differs from its pin waits for approval on every call until someone accepts it.

Times here are the fetching process's own clock (`time.time`): they are shown to people and
compared with nothing the ledger decides.
"""

from __future__ import annotations

import hashlib
import json
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from sqlalchemy import Connection, delete, select, update

from dex_celery.backend_errors import backend_errors
from dex_celery.store.dialect import insert_ignore
from dex_celery.store.repository import Store
from dex_celery.store.schema import mcp_servers, mcp_tool_pins

#: Who accepted the definitions a server listed the first time its list was fetched.
FIRST_SEEN = "first fetch"


def definition_digest(definition: Mapping[str, Any]) -> str:
    """sha256 of a tool's definition as canonical JSON (name, description, input schema,
    annotations): any change a person might care about changes it."""
    shown = {k: definition.get(k) for k in ("name", "description", "inputSchema", "annotations")}
    text = json.dumps(shown, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return hashlib.sha256(text.encode()).hexdigest()


@dataclass(frozen=True, slots=True)
class McpToolDefinition:
    """One tool as its server listed it (MCP's own field names)."""

    name: str
    description: str
    input_schema: Mapping[str, Any]
    annotations: Mapping[str, Any] | None
    digest: str

    @classmethod
    def of(
        cls,
        name: str,
        description: str,
        input_schema: Mapping[str, Any],
        annotations: Mapping[str, Any] | None,
    ) -> McpToolDefinition:
        raw = {
            "name": name,
            "description": description,
            "inputSchema": dict(input_schema),
            "annotations": dict(annotations) if annotations is not None else None,
        }
        return cls(name, description, input_schema, annotations, definition_digest(raw))

    def as_json(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "description": self.description,
            "inputSchema": dict(self.input_schema),
            "annotations": dict(self.annotations) if self.annotations is not None else None,
            "digest": self.digest,
        }

    @classmethod
    def from_json(cls, value: Mapping[str, Any]) -> McpToolDefinition:
        return cls.of(
            str(value["name"]),
            str(value.get("description") or ""),
            dict(value.get("inputSchema") or {}),
            value.get("annotations"),
        )


@dataclass(frozen=True, slots=True)
class McpServerState:
    """A server's row: its tools as last fetched (None: never fetched), when, the last error,
    and the tools whose definition changed since a person accepted it."""

    name: str
    location: str
    tools: tuple[McpToolDefinition, ...] | None
    fetched_at: float | None
    last_error: str | None
    last_error_at: float | None
    changed: tuple[str, ...] = ()

    @property
    def state(self) -> str:
        """`ok`, `unreachable` (listed once, the last fetch failed), `never fetched`, or
        `not reached` (never listed, the last try failed)."""
        if self.tools is None:
            return "not reached" if self.last_error else "never fetched"
        if self.last_error and (self.last_error_at or 0) > (self.fetched_at or 0):
            return "unreachable"
        return "ok"

    def as_json(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "location": self.location,
            "state": self.state,
            "tools": None if self.tools is None else len(self.tools),
            "fetched_at": self.fetched_at,
            "last_error": self.last_error,
            "last_error_at": self.last_error_at,
            "changed": list(self.changed),
        }


class McpCatalog:
    """The MCP tables of one store (no Redis needed: the CLI lists servers without it)."""

    def __init__(self, store: Store) -> None:
        self.store = store
        self.url = store.url

    def servers(self, names: Sequence[str] | None = None) -> dict[str, McpServerState]:
        """The rows of `names` (every row if None), with each server's changed tools."""
        query = select(mcp_servers)
        if names is not None:
            query = query.where(mcp_servers.c.name.in_(list(names)))
        with backend_errors("", self.url), self.store.engine.connect() as conn:
            rows = conn.execute(query).all()
            pins = _pins(conn, [str(r.name) for r in rows])
        found: dict[str, McpServerState] = {}
        for row in rows:
            tools = (
                None
                if row.tools is None
                else tuple(McpToolDefinition.from_json(t) for t in json.loads(row.tools))
            )
            own = pins.get(str(row.name), {})
            changed = tuple(
                t.name for t in tools or () if t.name in own and own[t.name] != t.digest
            )
            found[str(row.name)] = McpServerState(
                name=str(row.name),
                location=str(row.location),
                tools=tools,
                fetched_at=row.fetched_at,
                last_error=row.last_error,
                last_error_at=row.last_error_at,
                changed=changed,
            )
        return found

    def save_tools(
        self, name: str, location: str, tools: Sequence[McpToolDefinition]
    ) -> tuple[str, ...]:
        """Keep a freshly fetched list; returns the tools whose definition differs from the one
        accepted (a tool seen for the first time is accepted as it is)."""
        now = time.time()
        text = json.dumps([t.as_json() for t in tools], sort_keys=True)
        with backend_errors("", self.url), self.store.engine.begin() as conn:
            _upsert(conn, name, location, tools=text, fetched_at=now, last_error=None)
            pins = _pins(conn, [name]).get(name, {})
            for tool in tools:
                if tool.name not in pins:
                    insert_ignore(
                        conn,
                        mcp_tool_pins,
                        server=name,
                        tool=tool.name,
                        digest=tool.digest,
                        accepted_at=now,
                        accepted_by=FIRST_SEEN,
                    )
        return tuple(t.name for t in tools if t.name in pins and pins[t.name] != t.digest)

    def save_error(self, name: str, location: str, error: str) -> None:
        with backend_errors("", self.url), self.store.engine.begin() as conn:
            _upsert(conn, name, location, last_error=error[:2000], last_error_at=time.time())

    def changed_digest(self, server: str, tool: str) -> str | None:
        """The tool's current digest if it differs from the accepted one, else None (one
        primary-key read of each table: what a request for an MCP tool pays)."""
        state = self.servers([server]).get(server)
        if state is None or tool not in state.changed:
            return None
        return next(t.digest for t in state.tools or () if t.name == tool)

    def accept(self, server: str, tools: Sequence[str] | None, by: str) -> tuple[str, ...]:
        """Accept the current definition of `tools` (every changed one if None); returns the
        tools whose pin moved."""
        state = self.servers([server]).get(server)
        if state is None or state.tools is None:
            return ()
        current = {t.name: t.digest for t in state.tools}
        wanted = list(state.changed) if tools is None else [t for t in tools if t in current]
        now = time.time()
        with backend_errors("", self.url), self.store.engine.begin() as conn:
            for tool in wanted:
                conn.execute(
                    delete(mcp_tool_pins).where(
                        mcp_tool_pins.c.server == server, mcp_tool_pins.c.tool == tool
                    )
                )
                insert_ignore(
                    conn,
                    mcp_tool_pins,
                    server=server,
                    tool=tool,
                    digest=current[tool],
                    accepted_at=now,
                    accepted_by=by,
                )
        return tuple(wanted)


def _pins(conn: Connection, servers: Sequence[str]) -> dict[str, dict[str, str]]:
    if not servers:
        return {}
    rows = conn.execute(select(mcp_tool_pins).where(mcp_tool_pins.c.server.in_(list(servers))))
    found: dict[str, dict[str, str]] = {}
    for row in rows:
        found.setdefault(str(row.server), {})[str(row.tool)] = str(row.digest)
    return found


def _upsert(conn: Connection, name: str, location: str, **values: Any) -> None:
    done = conn.execute(
        update(mcp_servers)
        .where(mcp_servers.c.name == name)
        .values(location=location, **values)
        .execution_options(preserve_rowcount=True)
    ).rowcount
    if not done:
        insert_ignore(conn, mcp_servers, name=name, location=location, **values)
