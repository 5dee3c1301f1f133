"""What an install brings, as a fresh clone gets it.

- `make demo` installs the core package and nothing the dev extra adds on top (linters, type
  checker, browsers' drivers, other integrations): the pip command its Makefile target runs is
  resolved by pip itself (`--dry-run --report`), without installing anything.
- Every extra brings everything its documented examples import: each extra is installed from the
  built wheel into a fresh virtualenv of its own, which then runs the imports of the README's and
  docs' examples for it. A module a documented example imports must belong to the core or to an
  extra listed here, so a new example cannot slip past.

The extras' venvs are the slow part (about half a minute each from pip's local cache; they carry
the `install` mark: `pytest -m install`, `pytest -m "not install"`).
"""

from __future__ import annotations

import fcntl
import json
import os
import re
import shlex
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from devtools.processes import ROOT

PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]

#: Per extra, what its documented examples import (README.md, docs/*.md); the core package's
#: module of the integration is imported too, as an example's `from dex_celery... import`.
EXTRA_IMPORTS: dict[str, list[str]] = {
    "postgres": ["import psycopg"],
    "flower": ["import flower"],
    "gevent": ["import gevent", "import gevent.monkey"],
    "web": ["import dex_celery.web.app", "import dex_celery.web.server"],
    "metrics": ["import dex_celery.ops.metrics"],
    "otel": [
        "from opentelemetry import trace",
        "from opentelemetry.sdk.trace import TracerProvider",
    ],
    "mcp": [
        "from mcp import Client, StdioServerParameters",
        "from mcp.server.mcpserver import Context, MCPServer",
        "from mcp.types import ToolAnnotations",
        "import dex_celery.integrations.mcp.client",
        "import dex_celery.integrations.mcp.server",
        "import dex_celery.integrations.mcp.task_call",
        "import anyio",
        "import uvicorn",
    ],
    "openai-agents": [
        "from agents import Agent, Runner",
        "from dex_celery.integrations.frameworks.openai_agents import DexSession, dex_function_tools",
        "from dex_celery.testing.models.openai_agents import ScriptedModel",
    ],
    "pydantic-ai": [
        "from pydantic_ai import Agent, DeferredToolRequests, DeferredToolResults, ToolDenied",
        "from pydantic_ai.messages import TextPart",
        "from dex_celery.integrations.frameworks.pydantic_ai import DexTools",
        "from dex_celery.testing.models.pydantic_ai import ScriptedModel, tool_call",
    ],
    "langgraph": [
        "from langchain.agents import create_agent",
        "from langgraph.checkpoint.memory import InMemorySaver",
        "from langgraph.types import Command",
        "from langchain_core.messages import AIMessage, HumanMessage",
        "from dex_celery.integrations.frameworks.langgraph import DexConversation, dex_tools",
        "from dex_celery.testing.models.langchain import ScriptedChatModel",
    ],
    "google-adk": [
        "from google.adk.agents import LlmAgent",
        "from google.adk.apps import App, ResumabilityConfig",
        "from google.adk.runners import InMemoryRunner",
        "from google.genai import types",
        "from dex_celery.integrations.frameworks.google_adk import DexConversation, dex_adk_tools",
        "from dex_celery.testing.models.google_adk import ScriptedLlm, tool_call",
    ],
    "claude-agent-sdk": [
        "from claude_agent_sdk import ClaudeSDKClient, PermissionResultDeny",
        "from dex_celery.integrations.frameworks.claude_agent import DexClaude, model_tool_name",
        "from dex_celery.testing.models.claude_messages import ScriptedMessages, tool_use",
    ],
    "agent-framework": [
        "from agent_framework import Agent, Message",
        "from dex_celery.integrations.frameworks.agent_framework import DexTools, decision",
        "from dex_celery.testing.models.agent_framework import ScriptedChatClient, tool_call",
    ],
    "crewai": [
        "from crewai import Agent, Crew, Task",
        "from crewai.state.checkpoint_config import CheckpointConfig",
        "from dex_celery.integrations.frameworks.crewai import dex_crewai_tools",
        "from dex_celery.testing.models.crewai import ScriptedLLM, tool_call",
    ],
    "testing": ["import pytest", "from dex_celery.testing import PausePoint, assertions, effects"],
    "hiredis": ["import hiredis"],
    "bench": ["import dbos"],
    "docs": ["import mkdocs", "import mkdocstrings"],
}
#: Modules the examples import that are the reader's own (the examples' app modules).
OWN_MODULES = {"shop", "tools_app", "config", "tasks", "refunds"}
#: Top-level modules the core install provides.
CORE_MODULES = {"celery", "kombu", "redis", "sqlalchemy", "alembic", "click", "pydantic"}


def _clean_env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if not k.startswith(("DEX_", "PYTHON", "VIRTUAL"))}


def _run(args: list[str], cwd: Path, timeout: float = 600) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        args, cwd=cwd, env=_clean_env(), capture_output=True, text=True, timeout=timeout
    )


def _names(requirements: list[str]) -> set[str]:
    return {canonicalize_name(Requirement(r).name) for r in requirements}


def demo_pip_install_args() -> list[str]:
    """The arguments of the `pip install` that `make demo` runs on a fresh clone."""
    dry = _run(["make", "-n", "-B", "demo"], ROOT)
    assert dry.returncode == 0, dry.stderr
    lines = [line for line in dry.stdout.splitlines() if " install " in line and "pip" in line]
    assert len(lines) == 1, dry.stdout
    args = shlex.split(lines[0])
    return [a for a in args[args.index("install") + 1 :] if a != "--quiet"]


def test_make_demo_installs_no_dev_only_package(tmp_path: Path) -> None:
    args = demo_pip_install_args()
    report = tmp_path / "report.json"
    resolved = _run(
        [
            sys.executable, "-m", "pip", "install", "--dry-run", "--ignore-installed", "-q",
            "--report", str(report), *args,
        ],
        ROOT,
    )  # fmt: skip
    assert resolved.returncode == 0, resolved.stderr[-3000:]
    installs = {
        canonicalize_name(item["metadata"]["name"])
        for item in json.loads(report.read_text())["install"]
    }
    core = _names(PYPROJECT["dependencies"])
    dev_only = _names(PYPROJECT["optional-dependencies"]["dev"]) - core
    assert "dex-celery" in installs and core <= installs
    assert dev_only, "the dev extra adds nothing? then this test checks nothing"
    assert not installs & dev_only, f"make demo installs dev-only {sorted(installs & dev_only)}"


def _documented_imports() -> set[str]:
    """Top-level modules imported by the Python examples of the README and docs."""
    modules: set[str] = set()
    for page in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]:
        for block in re.findall(r"```python\n(.*?)```", page.read_text(), re.S):
            for line in block.splitlines():
                found = re.match(r"\s*(?:from\s+([\w.]+)\s+import|import\s+([\w.]+))", line)
                if found:
                    modules.add((found.group(1) or found.group(2)).split(".")[0])
    return modules


def test_every_extra_and_every_documented_import_is_listed() -> None:
    extras = set(PYPROJECT["optional-dependencies"]) - {"dev"}
    assert extras == set(EXTRA_IMPORTS)
    listed = {
        re.match(r"(?:from|import)\s+(\w+)", statement).group(1)  # type: ignore[union-attr]
        for statements in EXTRA_IMPORTS.values()
        for statement in statements
    }
    third_party = _documented_imports() - set(sys.stdlib_module_names) - {"__future__"}
    unlisted = third_party - listed - OWN_MODULES - CORE_MODULES - {"dex_celery"}
    assert not unlisted, f"documented imports no extra is checked for: {sorted(unlisted)}"


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The checkout's wheel, built once per run: under pytest-xdist the venvs' cases are spread
    over the processes (tests/support/runs/xdist_units.py), which share the run's temporary
    folder, so the first builds it under a lock and the others take it."""
    run_folder = tmp_path_factory.getbasetemp()
    if os.environ.get("PYTEST_XDIST_WORKER"):
        run_folder = run_folder.parent  # each process's own folder is inside the run's
    base = run_folder / "extras-wheel"
    base.mkdir(exist_ok=True)
    with (base / "lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not list(base.glob("dex_celery-*.whl")):
            built = _run(
                [
                    sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(base),
                    str(ROOT),
                ],
                base,
            )  # fmt: skip
            assert built.returncode == 0, built.stderr[-3000:]
    (found,) = base.glob("dex_celery-*.whl")
    return found


@pytest.mark.install
@pytest.mark.parametrize("extra", sorted(EXTRA_IMPORTS))
def test_a_fresh_venv_per_extra_runs_its_documented_imports(
    extra: str, wheel: Path, tmp_path: Path
) -> None:
    venv = tmp_path / "venv"
    made = _run([sys.executable, "-m", "venv", "--without-pip", str(venv)], tmp_path)
    assert made.returncode == 0, made.stderr
    python = venv / "bin" / "python"
    # The outer pip installs into the venv (`--python`): no pip bootstrapped into each one.
    pip = _run(
        [
            sys.executable, "-m", "pip", "--python", str(python), "install", "-q",
            "--no-compile", f"{wheel}[{extra}]",
        ],
        tmp_path,
    )  # fmt: skip
    assert pip.returncode == 0, pip.stderr[-3000:]
    script = "\n".join(EXTRA_IMPORTS[extra])
    ran = _run([str(python), "-c", script], tmp_path, timeout=120)
    assert ran.returncode == 0, f"[{extra}]: {ran.stderr[-2000:]}"
