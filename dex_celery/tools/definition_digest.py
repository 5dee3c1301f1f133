"""What an approval is bound to (S13.3, docs/guardrails.md): digests of a tool's definition and
of one call's arguments, and the binding of the two.

A person approves one call of one tool as it was defined when the call was requested: its
arguments schema (a Python tool's signature, or an MCP server's `inputSchema`), its declared
policy and annotations, and, for an MCP tool, whether its definition is still the one a person
accepted (its pin, docs/mcp.md). A deploy that changes any of these gives another definition
digest, and the worker whose tool it is no longer claims the approval: the call waits for a
person again. A docstring is not part of it (it changes what the model reads, not what runs).
"""

from __future__ import annotations

import hashlib
from dataclasses import asdict
from typing import Any

from dex_celery.tools.call_identity import canonical_json
from dex_celery.tools.tool import Tool

#: Per registered tool object (they live as long as the process): its static digest, computed
#: once. Keyed by `id` with the tool kept, so an id is never reused while its entry exists.
_static: dict[int, tuple[Tool, str]] = {}


def _digest(*parts: str) -> str:
    h = hashlib.sha256()
    for part in parts:
        data = part.encode()
        h.update(len(data).to_bytes(8, "big"))
        h.update(data)
    return h.hexdigest()


def _static_digest(tool: Tool) -> str:
    found = _static.get(id(tool))
    if found is not None and found[0] is tool:
        return found[1]
    policy: dict[str, Any] = asdict(tool.policy)
    text = canonical_json(
        {
            "name": tool.name,
            "input_schema": _plain(tool.input_schema or {}),
            "annotations": _plain(tool.annotations),
            "policy": _plain(policy),
        }
    )
    digest = _digest("dex-tool-definition", text)
    _static[id(tool)] = (tool, digest)
    return digest


def definition_digest(tool: Tool, pin: str | None = None) -> str:
    """The digest of `tool`'s definition; `pin`: what its approval gate says now (an MCP tool
    whose definition changed since a person accepted it), None when nothing."""
    static = _static_digest(tool)
    return static if not pin else _digest(static, pin)


def current_definition_digest(tool: Tool) -> str:
    """`definition_digest` with the tool's approval gate asked now (the worker's view)."""
    gate = tool.approval_gate
    return definition_digest(tool, gate() if gate is not None else None)


def binding_digest(arguments_digest: str, definition: str) -> str:
    """What an approval holds: the arguments it was given for under that definition."""
    return _digest("dex-approval", arguments_digest, definition)


def _plain(value: Any) -> Any:
    """Mappings, tuples and enums as plain JSON values (a policy's effect is a StrEnum)."""
    if isinstance(value, dict) or hasattr(value, "items"):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_plain(v) for v in value]
    if isinstance(value, str):
        return str(value)
    return value
