"""What makes two requests "the same call" (S12.2): the call as the tool will receive it.

A model that re-plans a write in its next turn rarely spells the arguments the same way: `10.0`
or `"10"` for an `int` parameter, an explicit `null` for an optional one, its default written
out. The worker's argument check (`arguments.check_arguments`, the same one the dispatcher runs
at request time) hands the tool the same values for all of these, so the tool would do the same
thing twice. Every rule that decides by arguments (the repeat guard, S5.4; the same ids asked
again, S2.3; the MCP server's unanswered calls) therefore compares this identity, never the
text as it was sent:

- a Python tool: the arguments after its signature model's validation and coercion, every
  parameter present (an omitted one with its default), as JSON values;
- a schema tool (an MCP server's tool): the arguments after the same JSON Schema check, with the
  schema's top-level `default`s filled in and numbers compared as JSON Schema compares them
  (`10.0` is `10`; `true` is not `1`);

then canonical JSON (sorted keys, no spaces). Secret values are `***` in that text and enter
the fingerprint only as a keyed digest (`repeat_digest.secrets_digest`).

Arguments that fail the check raise `InvalidToolArguments`, as at request time: nothing is
recorded for them.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import pydantic

from dex_celery.errors import InvalidToolArguments
from dex_celery.tools.arguments import check_arguments, validation_message
from dex_celery.tools.redact import REDACTED
from dex_celery.tools.repeat_digest import repeat_digest, secrets_digest
from dex_celery.tools.tool import Tool


def received_arguments(tool: Tool, arguments: Mapping[str, Any]) -> dict[str, Any]:
    """Every argument the tool will receive, defaults included, as JSON values."""
    model = tool.arguments_model
    if model is not None:
        try:
            value = model.model_validate(dict(arguments))
        except pydantic.ValidationError as e:  # worded as the request-time refusal
            raise InvalidToolArguments(validation_message(tool.name, e)) from None
        text = value.model_dump_json(by_alias=True, fallback=_opaque)
        loaded: dict[str, Any] = json.loads(text)
        return loaded
    checked = check_arguments(tool, arguments)
    schema = tool.input_schema or {}
    properties = schema.get("properties")
    if isinstance(properties, Mapping):
        for name, spec in properties.items():
            if name not in checked and isinstance(spec, Mapping) and "default" in spec:
                checked[name] = spec["default"]
    normal = json_number_form(checked)
    assert isinstance(normal, dict)
    return normal


def json_number_form(value: Any) -> Any:
    """`value` with every integral float as an int, recursively: how JSON (and JSON Schema)
    compare numbers, `10.0 == 10`; booleans stay booleans (JSON Schema: `true` is not `1`)."""
    if isinstance(value, float) and math.isfinite(value) and value.is_integer():
        return int(value)
    if isinstance(value, Mapping):
        return {str(k): json_number_form(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [json_number_form(v) for v in value]
    return value


def canonical_json(value: Any) -> str:
    """One text per JSON value: sorted keys, no spaces; NaN and infinities as their names
    (a `float` parameter may receive them) rather than an error."""
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


@dataclass(frozen=True, slots=True)
class CallIdentity:
    """One request as the tool will receive it (S12.2)."""

    #: The canonical arguments as received, secret values `***`. For a call that spelled every
    #: argument in its received form this is the stored arguments' text, so fingerprints written
    #: before the identity was defined this way still match such a call.
    text: str
    #: The digest two requests share exactly when they are the same call: the tool, `text`,
    #: and a keyed digest of the received secret values (`repeat_digest.py`).
    fingerprint: str
    #: Every argument as the tool receives it, secret values included: what a write budget
    #: sums (S13.1), never the raw request. Not part of the identity.
    received: Mapping[str, Any] = field(default_factory=dict, compare=False, repr=False)


def identify(tool: Tool, arguments: Mapping[str, Any], secret_key: str | None) -> CallIdentity:
    """The request's identity, checked once; `InvalidToolArguments` for arguments the tool's
    check refuses, `SecretKeyMissing` for secrets given without a key (nothing recorded)."""
    received = received_arguments(tool, arguments)
    names = tool.policy.secret_arguments
    text = canonical_json({k: (REDACTED if k in names else v) for k, v in received.items()})
    secrets = {n: received[n] for n in names if n in received}
    mac = secrets_digest(secrets, secret_key, given=any(n in arguments for n in names))
    return CallIdentity(text, repeat_digest(tool.name, text, mac), received)


def identity_text(tool: Tool, arguments: Mapping[str, Any]) -> str:
    """`CallIdentity.text` alone (no secret values needed: a recorded call's stored arguments)."""
    received = received_arguments(tool, arguments)
    names = tool.policy.secret_arguments
    return canonical_json({k: (REDACTED if k in names else v) for k, v in received.items()})


def _opaque(value: Any) -> str:
    """A default no JSON can hold (a sentinel object): its type, the same in every process."""
    return f"<{type(value).__module__}.{type(value).__qualname__}>"
