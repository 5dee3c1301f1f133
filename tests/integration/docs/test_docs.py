"""The API reference builds strictly from the docstrings and covers every public name.

`mkdocs build --strict` fails on any warning (a broken reference, a docstring mkdocstrings
cannot parse, a missing page); this test runs it, so `make test` and CI do too, then checks the
built page has an entry for every name in `dex_celery.__all__`, every `ToolPolicy` field, every
public method of the client and the events API, and the extras of pyproject.toml.
"""

from __future__ import annotations

import dataclasses
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

import dex_celery
from devtools.processes import ROOT
from dex_celery import AgentEvents, DexClient, ToolPolicy

pytest.importorskip("mkdocstrings", reason="the docs extra is not installed")


@pytest.fixture(scope="module")
def api_page(tmp_path_factory: pytest.TempPathFactory) -> str:
    site = tmp_path_factory.mktemp("site")
    mkdocs = Path(sys.executable).parent / "mkdocs"
    built = subprocess.run(
        [str(mkdocs), "build", "--strict", "-d", str(site)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert built.returncode == 0, built.stderr[-3000:]
    return (site / "api" / "index.html").read_text()


def _public(cls: type) -> list[str]:
    return [n for n in vars(cls) if not n.startswith("_")]


def test_every_public_name_is_documented(api_page: str) -> None:
    missing = [n for n in dex_celery.__all__ if f'id="dex_celery.{n}"' not in api_page]
    assert missing == []


def test_policy_fields_client_methods_and_events_are_documented(api_page: str) -> None:
    wanted = [f"ToolPolicy.{f.name}" for f in dataclasses.fields(ToolPolicy)]
    wanted += [f"DexClient.{n}" for n in _public(DexClient)]
    wanted += [f"AgentEvents.{n}" for n in _public(AgentEvents)]
    missing = [n for n in wanted if f'id="dex_celery.{n}"' not in api_page]
    assert missing == []
    assert "run_tool_calls" in api_page


def test_every_extra_is_documented(api_page: str) -> None:
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"][
        "optional-dependencies"
    ]
    for extra in set(extras) - {"dev"}:
        assert f"<code>{extra}</code>" in api_page, extra
