"""Each test's phases and seconds appended to a file as they end, for profiling the suite.

`DEX_TEST_TIMES=<file> pytest ...` writes one tab-separated line per phase (`<seconds>
<setup|call|teardown> <node id> <outcome>`), flushed at once: unlike `--durations` and
`--junitxml`, which are written at the end, a run cut short (a time limit) still leaves every
finished test's times (docs/testing.md, "Where the time goes"). Under pytest-xdist the
controller writes them, as each worker's report arrives.
"""

from __future__ import annotations

import os
from typing import TextIO

import pytest

TIMES_ENV = "DEX_TEST_TIMES"


class PhaseTimes:
    """Registered by tests/conftest.py for the controller process when `DEX_TEST_TIMES` is set."""

    def __init__(self, out: TextIO) -> None:
        self.out = out

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        self.out.write(f"{report.duration:.3f}\t{report.when}\t{report.nodeid}\t{report.outcome}\n")
        self.out.flush()

    def pytest_unconfigure(self) -> None:
        self.out.close()


def register(config: pytest.Config) -> None:
    """Write the times of this run if `DEX_TEST_TIMES` names a file (not in an xdist worker)."""
    path = os.environ.get(TIMES_ENV)
    if not path or hasattr(config, "workerinput"):
        return
    config.pluginmanager.register(PhaseTimes(open(path, "a")), "dex-test-times")  # noqa: SIM115
