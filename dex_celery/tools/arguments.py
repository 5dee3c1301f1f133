"""Tool arguments checked against the tool's own signature, once, before anything is written.

A Python tool's parameters (after the `ToolContext`) and their type hints become a pydantic
model; its JSON Schema is the tool's `input_schema`, exported as tool definitions
(`dex_celery.tools.definitions`) so nobody writes a schema twice. A tool registered with a JSON Schema
and no Python signature (an MCP server's tool) is checked against that schema instead, with
`jsonschema`. Both paths go through `check_arguments`, the one entry point used by the
dispatcher at request time and by the worker before the tool runs, so what the tool receives is
exactly what was validated and stored.
"""

from __future__ import annotations

import inspect
import typing
from collections.abc import Callable, Mapping
from dataclasses import replace
from types import MappingProxyType
from typing import Any

import pydantic
from pydantic import BaseModel, ConfigDict, Field

from dex_celery.errors import InvalidToolArguments, InvalidToolSignature
from dex_celery.tools.schema import check_against_schema, check_schema
from dex_celery.tools.tool import Tool

#: Parameter kinds a tool cannot have: arguments arrive by name, from a JSON object.
_POSITIONAL = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.VAR_POSITIONAL)


def signature_model(name: str, fn: Callable[..., Any]) -> type[BaseModel]:
    """The pydantic model of `fn`'s arguments (every parameter after the context).

    Fields are named `p0, p1, ...` with the parameter name as alias, so a parameter called
    `json` or `model_config` cannot collide with pydantic's own attributes.
    """
    try:
        signature = inspect.signature(fn)
    except (TypeError, ValueError) as e:
        raise InvalidToolSignature(f"tool {name!r}: cannot read its signature: {e}") from e
    try:
        hints = typing.get_type_hints(fn, include_extras=True)
    except Exception as e:  # a hint naming something not importable: the author must fix it
        raise InvalidToolSignature(f"tool {name!r}: its type hints cannot be resolved: {e}") from e
    params = list(signature.parameters.values())
    if not params or params[0].kind not in (
        inspect.Parameter.POSITIONAL_ONLY,
        inspect.Parameter.POSITIONAL_OR_KEYWORD,
    ):
        raise InvalidToolSignature(
            f"tool {name!r} must take the ToolContext as its first positional parameter"
        )
    fields: dict[str, Any] = {}
    extra: typing.Literal["allow", "forbid"] = "forbid"
    for i, param in enumerate(params[1:]):
        if param.kind in _POSITIONAL:
            raise InvalidToolSignature(
                f"tool {name!r}: parameter {param.name!r} is positional-only; tool arguments "
                "arrive by name"
            )
        if param.kind is inspect.Parameter.VAR_KEYWORD:
            extra = "allow"
            continue
        annotation = hints.get(param.name, Any)
        default = ... if param.default is inspect.Parameter.empty else param.default
        fields[f"p{i}"] = (annotation, Field(default, alias=param.name))
    # NaN and infinities serialise as their names, not `null`: the call's identity
    # (`call_identity.py`) must not take `float("nan")` for `None`.
    config = ConfigDict(extra=extra, populate_by_name=False, ser_json_inf_nan="strings")
    try:
        model: type[BaseModel] = pydantic.create_model(
            f"{name}_arguments", __config__=config, **fields
        )
        model.model_json_schema(by_alias=True)
    except (pydantic.PydanticSchemaGenerationError, pydantic.PydanticUserError) as e:
        raise InvalidToolSignature(
            f"tool {name!r}: a parameter type has no JSON Schema: {e}"
        ) from e
    return model


def schema_of(model: type[BaseModel], description: str = "") -> dict[str, Any]:
    """The JSON Schema of the arguments object, as tool definitions carry it."""
    schema = model.model_json_schema(by_alias=True)
    schema.pop("title", None)
    schema.setdefault("properties", {})
    if description:
        schema["description"] = description
    return schema


def schema_properties(schema: Mapping[str, Any]) -> frozenset[str]:
    props = schema.get("properties")
    return frozenset(props) if isinstance(props, Mapping) else frozenset()


def check_secret_names(
    name: str, secrets: tuple[str, ...], schema: Mapping[str, Any] | None
) -> None:
    """`secret_arguments` must name parameters the tool has; a typo would leak the real one.

    A tool that takes any argument (`**kwargs`, or a schema with `additionalProperties`) has no
    list to check against, so any name is accepted there.
    """
    if not secrets or (schema or {}).get("additionalProperties") is True:
        return
    known = schema_properties(schema or {})
    unknown = [s for s in secrets if s not in known]
    if unknown:
        raise InvalidToolSignature(
            f"tool {name!r}: secret_arguments names {', '.join(map(repr, unknown))}, which "
            f"{'is not a parameter' if len(unknown) == 1 else 'are not parameters'} of the "
            f"tool (parameters: {', '.join(sorted(known)) or 'none'})"
        )


def check_arguments(tool: Tool, arguments: Mapping[str, Any]) -> dict[str, Any]:
    """The arguments as the tool will receive them, or `InvalidToolArguments` (S9.3).

    With a signature model: pydantic's validated values (a `Decimal` parameter gets a Decimal),
    only the arguments that were given, so the function's own defaults apply to the rest.
    Without one: the arguments unchanged, after validating them against `input_schema`.
    """
    model = tool.arguments_model
    if model is not None:
        try:
            value = model.model_validate(dict(arguments))
        except pydantic.ValidationError as e:
            raise InvalidToolArguments(validation_message(tool.name, e)) from None
        fields = model.model_fields
        out = {
            fields[f].alias or f: getattr(value, f) for f in value.model_fields_set if f in fields
        }
        out.update(value.model_extra or {})
        return out
    if tool.input_schema is not None:
        check_against_schema(tool.name, tool.input_schema, arguments)
    return dict(arguments)


def validation_message(name: str, error: pydantic.ValidationError) -> str:
    problems = []
    for item in error.errors(include_url=False, include_input=False):
        where = ".".join(str(p) for p in item["loc"]) or "(arguments)"
        kind = item["type"]
        if kind == "missing":
            problems.append(f"missing required argument {where!r}")
        elif kind == "extra_forbidden":
            problems.append(f"unexpected argument {where!r}")
        else:
            problems.append(f"argument {where!r}: {item['msg']}")
    return f"invalid arguments for tool {name!r}: " + "; ".join(problems)


def prepare_tool(tool: Tool) -> Tool:
    """At registration: the tool with its arguments model and `input_schema`, checked.

    A tool given an `input_schema` keeps it and is checked against it (no signature model); a
    Python tool gets both from its signature. `secret_arguments` must name parameters (S10.4).
    """
    if tool.input_schema is not None:
        check_schema(tool.name, tool.input_schema)
        prepared = tool
    else:
        model = signature_model(tool.name, tool.function)
        prepared = replace(
            tool,
            input_schema=MappingProxyType(schema_of(model)),
            arguments_model=model,
        )
    check_secret_names(prepared.name, prepared.policy.secret_arguments, prepared.input_schema)
    return prepared
