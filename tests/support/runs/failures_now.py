"""Each failure named the moment it happens, not only in the summary at the end.

A run cut short (Ctrl-C, a CI job's time limit, a SIGKILL) prints no summary, so `pytest -q`'s
`F` characters were all a reader got: this plugin writes `FAILED <node id>` (or `ERROR <node
id>` for a fixture's setup or teardown) on a line of its own as soon as the report comes, and
flushes it (docs/testing.md). Under pytest-xdist the controller writes it, as each worker's
report arrives.
"""

from __future__ import annotations

import pytest


class FailuresNow:
    """Registered by tests/conftest.py for the controller process of a run."""

    def __init__(self, config: pytest.Config) -> None:
        self.config = config

    @pytest.hookimpl(trylast=True)
    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        if not report.failed:
            return
        reporter = self.config.pluginmanager.get_plugin("terminalreporter")
        if reporter is None:
            return
        word = "FAILED" if report.when == "call" else "ERROR"
        if reporter._tw.width_of_current_line:  # after `-q`'s progress characters
            reporter.write("\n")
        reporter.write_line(f"{word} {report.nodeid}", red=True, bold=True)
        reporter.flush()


def register(config: pytest.Config) -> None:
    """Name failures as they happen in this run (not in an xdist worker: it prints nothing)."""
    if hasattr(config, "workerinput"):
        return
    config.pluginmanager.register(FailuresNow(config), "dex-failures-now")
