"""`dex-celery mcp-servers`: the MCP servers an app registered, and their kept tool lists.

    dex-celery mcp-servers list [--json]          each server: state, tools, fetched when, error
    dex-celery mcp-servers refresh [NAME]         fetch the tool lists now (starts the servers)
    dex-celery mcp-servers accept NAME [TOOL...] --by WHO
                                                  accept a changed tool definition (every
                                                  changed tool of NAME if none is named; a
                                                  TOOL as the server lists it or its dex name)

`list` reads the database only: it starts no server process. `refresh` is the one command that
does (besides a worker's start). A tool whose definition changed since it was accepted waits for
approval on every call until `accept` (docs/semantics.md, "MCP servers").
"""

from __future__ import annotations

import json
from typing import Any

import click

from dex_celery.backend_errors import require_existing_database
from dex_celery.cli.context import EXIT_REFUSED, DexContext, pass_context
from dex_celery.model.times import format_utc
from dex_celery.ops.status import mcp_server_states
from dex_celery.store.mcp_catalog import McpCatalog


@click.group("mcp-servers")
def mcp_servers() -> None:
    """MCP servers registered with dex.add_mcp_server and their tool lists."""


def _sources(ctx: DexContext) -> list[Any]:
    return list(ctx.dex.tool_sources)


@mcp_servers.command("list")
@click.option("--json", "as_json", is_flag=True, help="One JSON array instead of lines.")
@pass_context
def list_servers(ctx: DexContext, as_json: bool) -> None:
    """Each server with its state, tool count, when its list was fetched and the last error
    (from the database: no server is started)."""
    require_existing_database(ctx.dex.settings.database_url)
    states = mcp_server_states(ctx.dex.store, [s.name for s in _sources(ctx)])
    if as_json:
        click.echo(json.dumps(states, indent=2, sort_keys=True))
        return
    if not states:
        click.echo("no MCP servers are registered")
        return
    for state in states:
        click.echo(_line(state))


def _line(state: dict[str, Any]) -> str:
    tools = "-" if state["tools"] is None else str(state["tools"])
    fetched = format_utc(state["fetched_at"]) if state["fetched_at"] else "never"
    line = f"{state['name']}  {state['state']}  tools {tools}  fetched {fetched}"
    if state["changed"]:
        line += f"  changed (approval required): {', '.join(state['changed'])}"
    if state["last_error"] and state["state"] != "ok":
        line += f"  last error {format_utc(state['last_error_at'])}: {state['last_error']}"
    return line


@mcp_servers.command("refresh")
@click.argument("name", required=False)
@pass_context
def refresh(ctx: DexContext, name: str | None) -> None:
    """Fetch the tool list of NAME (every server if none) now and keep it."""
    require_existing_database(ctx.dex.settings.database_url)
    sources = [s for s in _sources(ctx) if name is None or s.name == name]
    if name is not None and not sources:
        click.echo(f"error: no MCP server named {name!r} is registered", err=True)
        raise click.exceptions.Exit(EXIT_REFUSED)
    failed = []
    for source in sources:
        try:
            definitions = source.fetch()
        except Exception as e:  # one line per server; the others are still refreshed
            failed.append(source.name)
            click.echo(f"{source.name}: {e}")
            continue
        click.echo(f"{source.name}: {len(definitions)} tools")
    states = {s["name"]: s for s in mcp_server_states(ctx.dex.store, [s.name for s in sources])}
    for source in sources:
        changed = states.get(source.name, {}).get("changed") or []
        if changed:
            click.echo(
                f"{source.name}: changed since accepted (approval required): {', '.join(changed)}"
            )
    if failed:
        click.echo(f"error: cannot list {', '.join(failed)}", err=True)
        raise click.exceptions.Exit(EXIT_REFUSED)


@mcp_servers.command("accept")
@click.argument("name")
@click.argument("tools", nargs=-1)
@click.option("--by", "accepted_by", required=True, help="Who accepts (recorded).")
@pass_context
def accept(ctx: DexContext, name: str, tools: tuple[str, ...], accepted_by: str) -> None:
    """Accept the current definition of TOOLS of server NAME (every changed one if none):
    their calls no longer wait for approval because of the change. A tool is named as the
    server lists it or by its dex name (the one `approvals list` shows)."""
    require_existing_database(ctx.dex.settings.database_url)
    source = next((s for s in _sources(ctx) if s.name == name), None)
    if source is None:
        click.echo(f"error: no MCP server named {name!r} is registered", err=True)
        raise click.exceptions.Exit(EXIT_REFUSED)
    catalog = McpCatalog(ctx.dex.store)
    state = catalog.servers([name]).get(name)
    wanted: list[str] | None = None
    if tools:
        if state is None or state.tools is None:
            click.echo(
                f"error: no tool list of MCP server {name!r} is kept yet, so "
                f"{', '.join(map(repr, tools))} cannot be checked; run "
                f"`dex-celery mcp-servers refresh {name}` first",
                err=True,
            )
            raise click.exceptions.Exit(EXIT_REFUSED)
        wanted = _server_names(name, getattr(source, "prefix", ""), tools, state.tools)
        unchanged = [t for t in wanted if t not in state.changed]
        wanted = [t for t in wanted if t in state.changed]
        if unchanged:
            click.echo(
                f"{name}: nothing to accept for {', '.join(unchanged)} (its definition is the "
                "one accepted; its calls do not wait because of a change)"
            )
        if not wanted:
            return
    accepted = catalog.accept(name, wanted, accepted_by)
    if not accepted:
        click.echo(f"{name}: nothing to accept (no tool changed since it was accepted)")
        return
    click.echo(f"{name}: accepted {', '.join(accepted)}")


def _server_names(
    server: str, prefix: str, given: tuple[str, ...], listed: tuple[Any, ...]
) -> list[str]:
    """Each given name as the server lists it: the server's own name, or the dex name
    (`<prefix><name>`); an unknown one is one `error:` line and exit 1, nothing accepted."""
    names = [t.name for t in listed]
    out: list[str] = []
    unknown: list[str] = []
    for tool in given:
        if tool in names:
            out.append(tool)
        elif prefix and tool.startswith(prefix) and tool[len(prefix) :] in names:
            out.append(tool[len(prefix) :])
        else:
            unknown.append(tool)
    if unknown:
        dex_names = f" (dex names: {', '.join(prefix + n for n in names)})" if prefix else ""
        click.echo(
            f"error: MCP server {server!r} has no tool {', '.join(map(repr, unknown))}; its "
            f"tools: {', '.join(names) or 'none'}{dex_names}",
            err=True,
        )
        raise click.exceptions.Exit(EXIT_REFUSED)
    return list(dict.fromkeys(out))
