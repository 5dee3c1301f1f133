"""The README's "Agent frameworks and MCP" examples, run as written: the files are taken from
the README's `# file: NAME` blocks into a fresh folder, a real Celery worker runs `tools_app`, and
the MCP server is the example's own. Only the OpenAI model is swapped for the SDK's scripted
model (no network) and `input()` answers "y"."""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from agents import set_trace_processors
from agents.testing import ScriptedModel, assistant_message, function_call
from langchain_core.messages import AIMessage

from devtools.processes import ROOT, wait_for
from dex_celery import Dex

BLOCK = re.compile(r"```python\n# file: (\S+)\n(.*?)```", re.S)
MODEL_LINE = 'model = "gpt-5.1"  # any model the SDK can use'
PYDANTIC_MODEL_LINE = 'model = "openai:gpt-5.1"  # any model Pydantic AI can use'
LANGCHAIN_MODEL_LINE = 'model = "openai:gpt-5.1"  # any chat model LangChain can use'


def readme_files() -> dict[str, str]:
    return dict(BLOCK.findall((ROOT / "README.md").read_text()))


@pytest.fixture
def example(tmp_path: Path, env: dict[str, str]) -> Iterator[tuple[Path, dict[str, str]]]:
    folder = tmp_path / "example"
    folder.mkdir()
    for name, body in readme_files().items():
        (folder / name).write_text(body)
    run_env = {
        **os.environ,
        **env,
        "PYTHONPATH": str(folder),
        "PATH": f"{Path(sys.executable).parent}:{os.environ.get('PATH', '')}",
    }
    with (folder / "worker.log").open("wb") as log:
        worker = subprocess.Popen(
            [sys.executable, "-m", "celery", "-A", "tools_app", "worker", "-P", "prefork",
             "-c", "2", "--without-gossip", "--without-mingle", "--without-heartbeat",
             "-l", "info"],
            cwd=folder, env=run_env, stdout=log, stderr=subprocess.STDOUT,
            start_new_session=True,
        )  # fmt: skip
    try:
        # The worker reads the MCP server's tool list at start, before it takes messages; a
        # request sent meanwhile would wait in the queue past its start deadline on a loaded
        # machine.
        wait_for(
            lambda: b" ready." in (folder / "worker.log").read_bytes(),
            timeout=120,
            what="the README's worker to be ready",
        )
        yield folder, run_env
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(worker.pid, signal.SIGKILL)
        worker.wait(timeout=10)


def _run(folder: Path, env: dict[str, str], script: str) -> list[str]:
    out = subprocess.run(
        [sys.executable, script], cwd=folder, env=env, capture_output=True, text=True, timeout=120
    )
    assert out.returncode == 0, out.stderr[-3000:] + (folder / "worker.log").read_text()[-3000:]
    return out.stdout.splitlines()


def test_readme_has_the_example_files() -> None:
    files = readme_files()
    assert set(files) == {
        "orders_mcp_server.py",
        "tools_app.py",
        "ask.py",
        "use_over_mcp.py",
        "agent.py",
        "pydantic_agent.py",
        "langgraph_agent.py",
    }
    assert MODEL_LINE in files["agent.py"]


def test_readme_integration_examples_run(
    dex: Dex,
    example: tuple[Path, dict[str, str]],
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    folder, env = example
    # MCP servers' tools as dex tools, on the worker.
    assert _run(folder, env, "ask.py") == ['succeeded {"order_id": "A-1", "status": "open"}']
    # dex-celery mcp over stdio, with the mcp SDK's client.
    assert _run(folder, env, "use_over_mcp.py") == ["True", '{"order_id": "A-2", "status": "open"}']

    # The OpenAI Agents SDK example, in this process, with a scripted model.
    monkeypatch.chdir(folder)
    monkeypatch.syspath_prepend(str(folder))
    monkeypatch.delitem(sys.modules, "tools_app", raising=False)
    set_trace_processors([])
    model = ScriptedModel(
        [
            [function_call("lookup", {"order_id": "A-3"}, call_id="call_lookup")],
            [function_call("cancel", {"order_id": "A-3"}, call_id="call_cancel")],
            [assistant_message("Order A-3 is cancelled.")],
        ]
    )
    asked: list[str] = []
    source = readme_files()["agent.py"].replace(MODEL_LINE, "model = SCRIPTED")
    namespace = {
        "__name__": "__main__",
        "SCRIPTED": model,
        "input": lambda prompt: asked.append(prompt) or "y",
    }
    exec(compile(source, str(folder / "agent.py"), "exec"), namespace)

    assert capsys.readouterr().out.strip().endswith("Order A-3 is cancelled.")
    assert [p.split("(")[0] for p in asked] == ["Run cancel"]
    outputs = {
        item["call_id"]: item["output"]
        for item in model.calls[-1].input
        if isinstance(item, dict) and item.get("type") == "function_call_output"
    }
    assert outputs == {
        "call_lookup": '{"order_id": "A-3", "status": "open"}',
        "call_cancel": '{"result": "order A-3 cancelled"}',
    }
    sys.modules.pop("tools_app", None)


def _run_example(name: str, model_line: str, model: Any, folder: Path) -> tuple[str, list[str]]:
    """Run the README's `name` with `model` in place of its model line; `input()` says "y"."""
    asked: list[str] = []
    source = readme_files()[name].replace(model_line, "model = SCRIPTED")
    namespace = {
        "__name__": "__main__",
        "SCRIPTED": model,
        "input": lambda prompt: asked.append(prompt) or "y",
    }
    exec(compile(source, str(folder / name), "exec"), namespace)
    return name, asked


def test_readme_pydantic_ai_and_langgraph_examples_run(
    dex: Dex,
    example: tuple[Path, dict[str, str]],
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    from pydantic_ai.models.function import FunctionModel

    from dex_celery.testing.models.langchain import ScriptedChatModel, tool_call
    from tests.support.frameworks.pydantic_scripted import Scripted, call

    folder, _env = example
    monkeypatch.chdir(folder)
    monkeypatch.syspath_prepend(str(folder))
    monkeypatch.delitem(sys.modules, "tools_app", raising=False)
    assert PYDANTIC_MODEL_LINE in readme_files()["pydantic_agent.py"]
    assert LANGCHAIN_MODEL_LINE in readme_files()["langgraph_agent.py"]

    script = Scripted(
        [
            [call("lookup", {"order_id": "A-4"}, "call_lookup")],
            [call("cancel", {"order_id": "A-4"}, "call_cancel")],
            "Order A-4 is cancelled.",
        ]
    )
    _name, asked = _run_example(
        "pydantic_agent.py", PYDANTIC_MODEL_LINE, FunctionModel(script), folder
    )
    assert capsys.readouterr().out.strip().endswith("Order A-4 is cancelled.")
    assert [p.split("(")[0] for p in asked] == ["Run cancel"]
    assert script.tool_results() == {"call_cancel": '{"result": "order A-4 cancelled"}'}
    assert dex.client().pending_approvals() == []  # decided in dex, not left waiting

    chat = ScriptedChatModel(
        turns=[
            tool_call("lookup", {"order_id": "A-5"}, "call_lookup"),
            tool_call("cancel", {"order_id": "A-5"}, "call_cancel"),
            AIMessage("Order A-5 is cancelled."),
        ]
    )
    _name, asked = _run_example("langgraph_agent.py", LANGCHAIN_MODEL_LINE, chat, folder)
    assert capsys.readouterr().out.strip().endswith("Order A-5 is cancelled.")
    assert [p.split("(")[0] for p in asked] == ["Run cancel"]
    assert chat.tool_results() == {
        "call_lookup": '{"order_id": "A-5", "status": "open"}',
        "call_cancel": '{"result": "order A-5 cancelled"}',
    }
    record = dex.client().get_call("orders-desk-1/turn-2/call_cancel")
    assert record.approval is not None and record.approval.decided_by == "me"
    sys.modules.pop("tools_app", None)
