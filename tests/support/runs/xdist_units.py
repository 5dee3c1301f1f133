"""How `make test` shares the tests out among pytest-xdist's processes (`--dist loadfile`,
docs/testing.md, "The project's own test run").

A test file is one unit of work, run by one process, its tests in their order and its module
fixtures made once; the cases of a test in `SPREAD` are each a unit of their own instead, so a
test of long, independent cases (a fresh virtualenv each, tests/integration/deploy/test_install.py)
is spread over every process rather than being one process's tail. (pytest-xdist's own
`xdist_group` marks would say the same, but its `--dist loadgroup` does not group on pytest 9,
whose node ids it can no longer suffix.) The units are handed out longest first
(longest-processing-time order): a unit's length is the sum of its tests' estimates, from the
per-file seconds measured below, or a default per test for a file not listed. Handed out in
collection order instead, a long file met late keeps one process busy after the others are done.
"""

from __future__ import annotations

from collections import Counter

import pytest
from xdist.remote import Producer
from xdist.scheduler import LoadScopeScheduling
from xdist.workermanage import WorkerController

#: Seconds a whole file took in one measured run (docs/testing.md, "Where the time goes"); only
#: the order matters, so a stale figure costs some balance, never a result.
MEASURED_SECONDS: dict[str, float] = {
    "tests/integration/deploy/test_install.py": 207,
    "tests/crash/broker/test_broker_link_cut.py": 176,
    "tests/integration/docs/test_readme_kit.py": 124,
    "tests/crash/worker/test_chaos_run.py": 107,
    "tests/integration/bench/test_bench_smoke.py": 98,
    "tests/crash/worker/test_rolling_restarts.py": 88,
    "tests/integration/cli/test_second_run.py": 78,
    "tests/integration/integrations/test_mcp_tools.py": 76,
    "tests/crash/worker/test_repeat_guard.py": 51,
    "tests/integration/bench/test_bench_shapes_smoke.py": 42,
    "tests/integration/store/test_mcp_catalog.py": 41,
    "tests/integration/deploy/test_wheel.py": 34,
    "tests/integration/integrations/test_mcp_remote_tasks.py": 34,
    "tests/crash/requester/test_ts_conversation.py": 33,
    "tests/crash/broker/test_rabbitmq_broker.py": 33,
    "tests/integration/bench/test_bench_capacity_smoke.py": 32,
    "tests/crash/worker/test_pools.py": 31,
    "tests/crash/redis/test_sentinel_failover.py": 30,
    "tests/integration/engine/test_budget_race.py": 30,
    "tests/crash/worker/test_audit_under_load.py": 29,
    "tests/integration/integrations/test_mcp_tasks.py": 28,
    "tests/crash/worker/test_worker_killed.py": 28,
    "tests/crash/clock/test_clock_skew.py": 25,
    "tests/integration/engine/test_approvals.py": 25,
    "tests/crash/requester/test_prune_killed.py": 24,
}
#: Tests whose parametrized cases are each a unit of their own: they share no module fixture
#: but a cheap one (made again in each process that runs a case) and each takes long.
SPREAD = {
    "tests/integration/deploy/test_install.py"
    "::test_a_fresh_venv_per_extra_runs_its_documented_imports",
}
#: The estimate for a test of a file not in `MEASURED_SECONDS`.
DEFAULT_TEST_SECONDS = 0.5


def _file_of(nodeid: str) -> str:
    return nodeid.split("::", 1)[0]


class LongestFilesFirst(LoadScopeScheduling):
    """pytest-xdist's scope scheduling: files (a `SPREAD` test's cases) as units, longest first."""

    _estimates: dict[str, float]

    def __init__(self, config: pytest.Config, log: Producer | None = None) -> None:
        super().__init__(config, log)
        self._estimates = {}

    def _split_scope(self, nodeid: str) -> str:
        return nodeid if nodeid.split("[", 1)[0] in SPREAD else _file_of(nodeid)

    def _estimate(self, scope: str) -> float:
        if not self._estimates:
            per_file = Counter(_file_of(nodeid) for nodeid in self.collection or ())
            for unit, nodeids in self.workqueue.items():
                self._estimates[unit] = sum(
                    MEASURED_SECONDS[path] / per_file[path]
                    if path in MEASURED_SECONDS
                    else DEFAULT_TEST_SECONDS
                    for path in map(_file_of, nodeids)
                )
        return self._estimates.get(scope, 0.0)

    def _assign_work_unit(self, node: WorkerController) -> None:
        if self.workqueue:
            longest = max(self.workqueue, key=self._estimate)
            self.workqueue.move_to_end(longest, last=False)
        super()._assign_work_unit(node)
