"""Unit tests of the integrations' pure parts, and of the core without the optional extras."""

from __future__ import annotations

import subprocess
import sys
from types import MappingProxyType

import pytest
from mcp.types import ToolAnnotations

from devtools.processes import ROOT
from dex_celery import EffectClass, InvalidArguments, InvalidId, ToolPolicy
from dex_celery.errors import ConfigurationError
from dex_celery.integrations.mcp.client import (
    IDEMPOTENCY_META_KEY,
    MCP_DEFAULT_HINTS,
    McpServer,
    hints_with_defaults,
)
from dex_celery.integrations.mcp.server import (
    ANONYMOUS_TURN,
    SESSION_META_KEY,
    TOOL_CALL_META_KEY,
    TURN_META_KEY,
    CallIds,
    annotations_for,
    call_ids,
)
from dex_celery.model.policy import effect_from_annotations
from dex_celery.tools.schema import check_against_schema, check_schema
from dex_celery.tools.signature_schema import arguments_schema
from dex_celery.tools.tool import Tool

SCHEMA = {
    "type": "object",
    "properties": {"order_id": {"type": "string"}, "secret": {"type": "integer"}},
    "required": ["order_id"],
    "additionalProperties": False,
}


def test_arguments_checked_against_the_schema_without_showing_values() -> None:
    check_against_schema("t", SCHEMA, {"order_id": "A", "secret": 3})
    with pytest.raises(InvalidArguments, match="'order_id' is a required property"):
        check_against_schema("t", SCHEMA, {})
    with pytest.raises(InvalidArguments) as caught:
        check_against_schema("t", SCHEMA, {"order_id": "A", "secret": "hunter2-value"})
    assert "secret: fails type 'integer'" in str(caught.value)
    assert "hunter2-value" not in str(caught.value)  # S10.4: never the value
    with pytest.raises(InvalidArguments, match="Additional properties"):
        check_against_schema("t", SCHEMA, {"order_id": "A", "other": 1})


def test_an_invalid_schema_is_a_registration_error() -> None:
    with pytest.raises(ConfigurationError, match="not a JSON Schema"):
        check_schema("t", {"type": "no-such-type"})


@pytest.mark.parametrize(
    ("hints", "effect"),
    [
        ({}, EffectClass.NON_IDEMPOTENT_WRITE),  # no annotations: MCP's defaults
        ({"read_only_hint": True}, EffectClass.READ),
        ({"read_only_hint": True, "destructive_hint": True}, EffectClass.READ),
        ({"idempotent_hint": True}, EffectClass.IDEMPOTENT_WRITE),
        ({"idempotent_hint": True, "destructive_hint": False}, EffectClass.IDEMPOTENT_WRITE),
        ({"destructive_hint": False}, EffectClass.NON_IDEMPOTENT_WRITE),
        ({"open_world_hint": False}, EffectClass.NON_IDEMPOTENT_WRITE),
        ({"title": "only a title"}, EffectClass.NON_IDEMPOTENT_WRITE),
    ],
)
def test_mcp_annotations_with_defaults_give_the_effect_class(
    hints: dict[str, object], effect: EffectClass
) -> None:
    annotations = ToolAnnotations(**hints) if hints else None  # type: ignore[arg-type]
    filled = hints_with_defaults(annotations)
    assert set(MCP_DEFAULT_HINTS) <= set(filled)  # every hint present
    given = annotations.model_dump(by_alias=True, exclude_none=True) if annotations else {}
    assert all(filled[k] == v for k, v in given.items())  # given hints kept
    assert effect_from_annotations(filled) is effect


def _tool(effect: EffectClass) -> Tool:
    return Tool("t", lambda ctx: None, ToolPolicy(effect=effect), MappingProxyType({}))


def test_served_annotations_round_trip_to_the_same_class() -> None:
    """What `dex-celery mcp` lists reads back, through `add_mcp_server`, as the same class."""
    for effect in EffectClass:
        served = annotations_for(_tool(effect))
        back = effect_from_annotations(hints_with_defaults(served))
        expected = (
            EffectClass.NON_IDEMPOTENT_WRITE if effect is EffectClass.UNCLASSIFIED else effect
        )
        assert back is expected, effect


def test_call_ids_from_meta() -> None:
    expected = CallIds("s", "t", "c")
    assert call_ids({IDEMPOTENCY_META_KEY: "s/t/c"}, "default") == expected
    ids = {SESSION_META_KEY: "s", TURN_META_KEY: "t", TOOL_CALL_META_KEY: "c"}
    assert call_ids(ids, "default") == expected
    fresh = call_ids(None, "default")
    assert (fresh.session_id, fresh.turn_id) == ("default", ANONYMOUS_TURN)
    assert call_ids({}, "default").tool_call_id != fresh.tool_call_id
    with pytest.raises(InvalidId):
        call_ids({IDEMPOTENCY_META_KEY: "s/t"}, "default")
    with pytest.raises(InvalidId):
        call_ids({SESSION_META_KEY: "s"}, "default")


def test_mcp_server_needs_exactly_one_address() -> None:
    with pytest.raises(ConfigurationError):
        McpServer("x")
    with pytest.raises(ConfigurationError):
        McpServer("x", command=("a",), url="http://h/mcp")


BLOCK_EXTRAS = """
import importlib.abc, sys
class Block(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in ("mcp", "mcp_types", "agents"):
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
sys.meta_path.insert(0, Block())
"""


def test_the_core_works_without_the_extras() -> None:
    """`import dex_celery`, the CLI and `add_mcp_server`'s error, with mcp and agents missing."""
    script = BLOCK_EXTRAS + (
        "import dex_celery, dex_celery.cli.main\n"
        "from celery import Celery\n"
        "from dex_celery import Dex, Settings, ConfigurationError\n"
        "dex = Dex(Celery('x'), Settings.from_env({}))\n"
        "try:\n"
        "    dex.add_mcp_server('s', command=['true'])\n"
        "except ConfigurationError as e:\n"
        "    print('refused:', e)\n"
        "assert not {'mcp', 'agents'} & set(sys.modules)\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", script], cwd=ROOT, capture_output=True, text=True, timeout=60
    )
    assert out.returncode == 0, out.stderr
    assert "refused: add_mcp_server needs the mcp extra" in out.stdout

    cli = BLOCK_EXTRAS + "from dex_celery.cli.main import main\nmain(['mcp'])\n"
    out = subprocess.run(
        [sys.executable, "-c", cli], cwd=ROOT, capture_output=True, text=True, timeout=60
    )
    assert out.returncode == 2
    assert out.stderr.startswith("error: dex-celery mcp needs the mcp extra")
    assert "Traceback" not in out.stderr


def _typed(
    ctx: object, name: str, count: int, ratio: float | None = None, flag: bool = False
) -> None:
    """A tool function with simple annotations."""


def _open(ctx: object, **arguments: object) -> None:
    """A tool function that takes anything."""


def test_arguments_schema_from_the_signature_or_the_tool() -> None:
    typed = Tool("t", _typed, ToolPolicy(), MappingProxyType({}))
    assert arguments_schema(typed) == {
        "type": "object",
        "properties": {
            "name": {"type": "string"},
            "count": {"type": "integer"},
            "ratio": {"type": ["number", "null"]},
            "flag": {"type": "boolean"},
        },
        "required": ["name", "count"],
        "additionalProperties": False,
    }
    check_schema("t", arguments_schema(typed))
    open_ended = Tool("o", _open, ToolPolicy(), MappingProxyType({}))
    assert arguments_schema(open_ended)["additionalProperties"] is True
    given = Tool("g", _open, ToolPolicy(), MappingProxyType({}), input_schema=SCHEMA)
    assert arguments_schema(given) == SCHEMA
