"""The claim gate a warm shutdown shuts (docs/reliability.md, "Deploys"): one byte shared with the
pool processes forked before the shutdown began."""

from __future__ import annotations

import os
import time

from dex_celery.engine.attempt.shutdown_gate import ShutdownGate


def test_a_forked_pool_process_sees_the_gate_its_parent_shuts() -> None:
    gate = ShutdownGate()
    pid = os.fork()
    if pid == 0:  # the "pool process": exits 0 once it sees the gate shut, 1 after 10 s
        deadline = time.monotonic() + 10
        while not gate.shut_already and time.monotonic() < deadline:
            time.sleep(0.01)
        os._exit(0 if gate.shut_already else 1)
    assert not gate.shut_already
    gate.shut()
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0


def test_sleep_is_cut_short_when_the_gate_shuts() -> None:
    """A retry's backoff waited out before the claim ends as soon as the worker stops."""
    gate = ShutdownGate()
    assert gate.sleep(0.05) is True
    gate.shut()
    started = time.monotonic()
    assert gate.sleep(30) is False
    assert time.monotonic() - started < 1
