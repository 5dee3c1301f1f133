"""The registry of a `Dex`'s tools, with sources that register tools only when needed.

Python tools are registered at import. An MCP server's tools are not known until its tool list
is read, and registering the server connects to nothing (`integrations/mcp/client.py`): it adds a
`ToolSource`. A lookup of a name not registered yet asks each source to register what it has
(its list as kept in the database, fetched first if it never was), so the first request for one
of its tools is what reads the list in a requester, and nothing else does.
"""

from __future__ import annotations

import threading
from typing import Protocol

from dex_celery.errors import DexError, UnknownTool
from dex_celery.tools.tool import Tool


class ToolSource(Protocol):
    """Tools registered on demand (an MCP server)."""

    @property
    def name(self) -> str: ...

    def provide(self, tool_name: str | None) -> DexError | None:
        """Register this source's tools so `tool_name` (None: any) is found if it is one of
        them; the error that kept it from knowing its tools (then the name may be its), else
        None."""
        ...

    def claims(self, tool_name: str) -> bool:
        """True when `tool_name` can only be this source's (its own prefix or its list of
        names says so): then the source's error answers a request for it. Otherwise a name
        no source registered is an unknown tool, even while some source cannot be reached."""
        ...

    def refresh(self) -> None:
        """Read the source's tools anew (a worker's start); never raises for the source being
        unreachable (its kept list, if any, is used)."""
        ...

    def close(self) -> None:
        """Let go of what this process holds open for the source (a worker process's shutdown:
        an MCP server's warm sessions); never raises."""
        ...


class ToolCatalog(dict[str, Tool]):
    """Tools by name; a missing name is looked for in the sources before `KeyError`.

    `tools[name]` (what `find_tool` does) consults the sources; `get`, `in` and iteration see
    only what is registered (the read-only paths: they never make a source connect).
    """

    def __init__(self) -> None:
        super().__init__()
        self.sources: list[ToolSource] = []
        self._lock = threading.RLock()

    def __missing__(self, name: str) -> Tool:
        claimed: list[DexError] = []
        unclaimed: list[DexError] = []
        with self._lock:
            for source in list(self.sources):
                if dict.__contains__(self, name):
                    break
                error = source.provide(name)
                if error is not None:
                    (claimed if source.claims(name) else unclaimed).append(error)
            if dict.__contains__(self, name):
                return dict.__getitem__(self, name)
        if claimed:
            raise claimed[0]
        if unclaimed:
            # A mistyped name is not news of a dead server: the known names answer it, and
            # the servers whose lists could not be read are mentioned, not blamed.
            known = ", ".join(sorted(self)) or "none"
            unread = "; ".join(str(e) for e in unclaimed)
            raise UnknownTool(
                f"no tool named {name!r} is registered (known: {known}); not listed yet: {unread}"
            )
        raise KeyError(name)

    def provide_all(self) -> list[DexError]:
        """Every source registers the tools it knows (an agent loop listing tool definitions);
        the errors of those that could not, for the caller to report or ignore."""
        errors = []
        with self._lock:
            for source in list(self.sources):
                try:
                    error = source.provide(None)
                except DexError as e:  # the database: the caller lists what it has
                    error = e
                if error is not None:
                    errors.append(error)
        return errors

    def refresh_sources(self) -> None:
        """Every source reads its tools anew (a worker at start)."""
        for source in list(self.sources):
            source.refresh()

    def close_sources(self) -> None:
        """Every source lets go of what this process holds open (a worker process's shutdown)."""
        for source in list(self.sources):
            source.close()
