"""Request-time check of a tool's arguments against its JSON Schema (S9.3).

Tools that carry an `input_schema` (every MCP tool does: its server's `inputSchema`) get their
arguments checked when the call is requested, so a call the tool would refuse is refused before
anything is recorded or enqueued. The error names where the arguments went wrong and which rule
failed, never the offending value: a value may be a secret (S10.4).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import jsonschema
from jsonschema.exceptions import SchemaError

from dex_celery.errors import InvalidToolArguments, InvalidToolSignature

#: How many problems one error message lists before it says "and N more".
_MAX_LISTED = 3


def check_schema(tool_name: str, schema: Mapping[str, Any]) -> None:
    """A given `input_schema` must be a valid JSON Schema of an object: a registration error
    (`InvalidToolSignature`, a `ConfigurationError`), never a per-call one."""
    try:
        jsonschema.validators.validator_for(schema).check_schema(dict(schema))
    except SchemaError as e:
        raise InvalidToolSignature(
            f"tool {tool_name!r}: input_schema is not a JSON Schema: {e.message}"
        ) from e
    if schema.get("type", "object") != "object":
        raise InvalidToolSignature(f"tool {tool_name!r}: input_schema must describe an object")


def check_against_schema(
    tool_name: str, schema: Mapping[str, Any], arguments: Mapping[str, Any]
) -> None:
    """Raise `InvalidToolArguments` (an `InvalidArguments`) if `arguments` do not satisfy
    `schema`; nothing is recorded. Called through `arguments.check_arguments` for tools that
    have a schema but no Python signature."""
    validator = jsonschema.validators.validator_for(schema)(schema)
    problems = sorted(validator.iter_errors(dict(arguments)), key=lambda e: list(e.absolute_path))
    if not problems:
        return
    listed = "; ".join(_describe(e) for e in problems[:_MAX_LISTED])
    more = f" (and {len(problems) - _MAX_LISTED} more)" if len(problems) > _MAX_LISTED else ""
    raise InvalidToolArguments(
        f"the arguments of tool {tool_name!r} do not match its input schema: {listed}{more}"
    )


def _describe(error: jsonschema.ValidationError) -> str:
    where = "/".join(str(p) for p in error.absolute_path) or "(arguments)"
    if error.validator in ("required", "additionalProperties", "dependentRequired"):
        # These messages name properties, not values.
        return f"{where}: {error.message}"
    return f"{where}: fails {error.validator!s} {error.validator_value!r}"
