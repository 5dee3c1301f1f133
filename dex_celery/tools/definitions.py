"""Tool definitions for model APIs, built from each tool's `input_schema` (written once).

`openai`: Chat Completions `{"type": "function", "function": {...}}`; `anthropic`: Messages API
`{"name", "description", "input_schema"}`; `mcp`: an MCP `Tool` (`inputSchema`, `annotations`,
with hints from the effect class when the tool carries none, S1.4).
"""

from __future__ import annotations

import copy
from collections.abc import Iterable, Mapping
from typing import Any

from dex_celery.errors import UnknownDefinitionFormat
from dex_celery.model.effects import traits_of
from dex_celery.tools.tool import Tool

FORMATS = ("openai", "anthropic", "mcp")


def tool_definitions(tools: Iterable[Tool], format: str = "openai") -> list[dict[str, Any]]:
    if format not in FORMATS:
        raise UnknownDefinitionFormat(
            f"unknown tool definition format {format!r}; expected one of: {', '.join(FORMATS)}"
        )
    return [definition(tool, format) for tool in sorted(tools, key=lambda t: t.name)]


def definition(tool: Tool, format: str) -> dict[str, Any]:
    schema = _plain(tool.input_schema or {"type": "object", "properties": {}})
    schema.pop("description", None)
    if format == "openai":
        return {
            "type": "function",
            "function": {"name": tool.name, "description": tool.description, "parameters": schema},
        }
    if format == "anthropic":
        return {"name": tool.name, "description": tool.description, "input_schema": schema}
    return {
        "name": tool.name,
        "description": tool.description,
        "inputSchema": schema,
        "annotations": mcp_hints(tool),
    }


def mcp_hints(tool: Tool) -> dict[str, Any]:
    """MCP annotations of a tool: the hints of its declared class (its row of
    `model/effects.py`), beside the
    tool's own other annotations (a title, `openWorldHint`). A policy that overrides a server's
    hints is what clients are told, so every output agrees with how dex runs the tool."""
    effect = tool.declared_effect
    own = {k: v for k, v in _plain(tool.annotations).items() if k not in _EFFECT_HINTS}
    if effect is None:
        return own
    return {**own, **traits_of(effect).mcp_hints}


#: The hints the effect class decides.
_EFFECT_HINTS = frozenset({"readOnlyHint", "destructiveHint", "idempotentHint"})


def _plain(value: Mapping[str, Any]) -> dict[str, Any]:
    """A deep, mutable copy (schemas are kept read-only on the tool)."""

    def walk(v: Any) -> Any:
        if isinstance(v, Mapping):
            return {k: walk(x) for k, x in v.items()}
        if isinstance(v, list | tuple):
            return [walk(x) for x in v]
        return copy.copy(v)

    return dict(walk(value))
