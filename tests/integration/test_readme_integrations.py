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

import pytest
from agents import set_trace_processors
from agents.testing import ScriptedModel, assistant_message, function_call

from dex_celery import Dex
from tests.support.processes import ROOT

BLOCK = re.compile(r"```python\n# file: (\S+)\n(.*?)```", re.S)
MODEL_LINE = 'model = "gpt-5.1"  # any model the SDK can use'


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
             "-c", "2", "--without-gossip", "--without-mingle", "--without-heartbeat"],
            cwd=folder, env=run_env, stdout=log, stderr=subprocess.STDOUT,
            start_new_session=True,
        )  # fmt: skip
    try:
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
