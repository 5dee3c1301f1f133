"""The `cli` fixture of the CLI tests: `dex-celery --app devtools.toolapp:dex ...` through
click's CliRunner, on the test's own deployment (its Redis and database)."""

from __future__ import annotations

from collections.abc import Callable

import pytest
from click.testing import CliRunner, Result

from dex_celery import Dex
from dex_celery.cli.main import main

#: The test tools' app, its `dex` replaced by the test's for the length of one test.
TOOL_APP = "devtools.toolapp:dex"


@pytest.fixture
def cli(dex: Dex, monkeypatch: pytest.MonkeyPatch) -> Callable[..., Result]:
    """Run one command as `dex-celery --app devtools.toolapp:dex ARGS`; `code`: its exit code."""
    import devtools.toolapp as toolapp  # deferred: the fixture's `dex` is built first

    monkeypatch.setattr(toolapp, "dex", dex)

    def run(*args: str, code: int = 0) -> Result:
        result = CliRunner().invoke(main, ["--app", TOOL_APP, *args], catch_exceptions=False)
        assert result.exit_code == code, result.output
        return result

    return run
