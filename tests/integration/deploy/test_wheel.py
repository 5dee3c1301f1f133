"""The built wheel, installed into a fresh virtualenv outside the repository, as a user gets it.

It holds `dex_celery` only: the repository's `config`, `tasks` and `reconcile` (the compose
file's thin modules) are not importable there, so they can never shadow a host project's own
modules of those common names; and `dex-celery demo` runs from any folder, on the order desk
example shipped inside the package.
"""

from __future__ import annotations

from pathlib import Path

from tests.support.processes.built_wheel import _run
from tests.support.processes.built_wheel import installed as installed


def test_the_demo_runs_from_the_installed_wheel_in_any_folder(
    installed: Path, tmp_path: Path
) -> None:
    folder = tmp_path / "someone-elses-project"
    folder.mkdir()
    result = _run([str(installed / "bin" / "dex-celery"), "demo"], folder)
    assert result.returncode == 0, (result.stdout[-3000:], result.stderr[-3000:])
    for outcome in ("succeeded", "failed", "rejected", "outcome_unknown"):
        assert outcome in result.stdout


def test_the_reference_deployment_modules_are_not_installed(
    installed: Path, tmp_path: Path
) -> None:
    python = str(installed / "bin" / "python")
    for module in ("config", "tasks", "reconcile"):
        result = _run([python, "-c", f"import {module}"], tmp_path)
        assert result.returncode != 0 and "ModuleNotFoundError" in result.stderr, module
    found = _run([python, "-c", "import dex_celery.examples.orderdesk.desk"], tmp_path)
    assert found.returncode == 0, found.stderr


def test_commands_without_an_app_give_a_hint_not_the_example(
    installed: Path, tmp_path: Path
) -> None:
    result = _run([str(installed / "bin" / "dex-celery"), "approvals", "list"], tmp_path)
    assert result.returncode == 1
    assert result.stderr.startswith("error: no app given") and "Traceback" not in result.stderr
    assert list(tmp_path.iterdir()) == []
