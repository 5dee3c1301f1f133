"""The CrewAI tests' guard: CrewAI cannot be installed beside the `mcp` extra, so the main
virtualenv skips them, saying why; the Makefile's .venv-crewai runs them with
`DEX_REQUIRE_CREWAI=1`, where a missing CrewAI is a failure, never a silent skip."""

from __future__ import annotations

import importlib.util
import os

import pytest

REQUIRE_ENV = "DEX_REQUIRE_CREWAI"


def require_crewai() -> None:
    """Skip the calling test module when CrewAI is not installed (fail under REQUIRE_ENV)."""
    if importlib.util.find_spec("crewai") is not None:
        return
    if os.environ.get(REQUIRE_ENV):
        raise RuntimeError(f"{REQUIRE_ENV} is set but CrewAI is not installed here")
    pytest.skip(
        "CrewAI is not installed in this virtualenv: it pins mcp<2 and openai<3, so its tests "
        "run in .venv-crewai (`make test`)",
        allow_module_level=True,
    )
