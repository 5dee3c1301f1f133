"""The JSON Schema a framework is shown for a tool's arguments.

A tool with an `input_schema` (every MCP tool) is shown that schema. A Python tool without one
is described from its signature: each parameter after the `ToolContext` becomes a property,
typed from simple annotations, required when it has no default; `**kwargs` allows other
properties. This is for describing tools to models and MCP clients only; what a request may
carry is checked when the call is requested.
"""

from __future__ import annotations

import inspect
import types
import typing
from collections.abc import Mapping
from typing import Any

from dex_celery.tools.tool import Tool

_JSON_TYPES: Mapping[Any, str] = {
    str: "string",
    int: "integer",
    float: "number",
    bool: "boolean",
    dict: "object",
    list: "array",
    tuple: "array",
    type(None): "null",
}


def arguments_schema(tool: Tool) -> dict[str, Any]:
    """The tool's `input_schema`, or one read from its function's signature."""
    if tool.input_schema is not None:
        return dict(tool.input_schema)
    try:
        signature = inspect.signature(tool.function)
        hints = typing.get_type_hints(tool.function)
    except (TypeError, ValueError, NameError):
        return {"type": "object"}
    parameters = list(signature.parameters.values())[1:]  # the first is the ToolContext
    properties: dict[str, Any] = {}
    required: list[str] = []
    open_ended = False
    for p in parameters:
        if p.kind is inspect.Parameter.VAR_KEYWORD:
            open_ended = True
            continue
        if p.kind in (inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.POSITIONAL_ONLY):
            continue
        properties[p.name] = _property(hints.get(p.name, Any))
        if p.default is inspect.Parameter.empty:
            required.append(p.name)
    schema: dict[str, Any] = {"type": "object", "properties": properties}
    if required:
        schema["required"] = required
    schema["additionalProperties"] = open_ended
    return schema


def _property(annotation: Any) -> dict[str, Any]:
    origin = typing.get_origin(annotation) or annotation
    if origin in (typing.Union, types.UnionType):
        options = [_property(a) for a in typing.get_args(annotation)]
        kinds = [o["type"] for o in options if "type" in o]
        return {"type": kinds} if len(kinds) == len(options) else {}
    kind = _JSON_TYPES.get(origin)
    return {"type": kind} if kind is not None else {}
