"""The channel from prefork pool processes to the worker's outcome recorder (issue 25).

Real forks, a real pipe, a real recorder process: what a pool process sends reaches the
recorder's writer whole and once, frames of several processes never mix, the recorder writes
what it holds before it exits, and whatever the channel cannot carry (the main process itself,
a long row, a full pipe, a recorder that is gone) is refused (`send` False) so the pool process
records it itself: nothing is dropped silently.
"""

from __future__ import annotations

import os
import select
import signal
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from dex_celery.engine.attempt.outcome_writer import OutcomeChannel, decode_row, encode_row
from dex_celery.model.ids import CallKey
from dex_celery.model.outcomes import CallStatus
from dex_celery.store.values import Outcome, OutcomeRow


def _row(n: int, result: str = "done") -> OutcomeRow:
    outcome = Outcome(CallStatus.SUCCEEDED, "", result=result, attempts=1)
    return OutcomeRow(CallKey.of("s", "t", f"c{n}"), "noop", "{}", outcome)


class FileWriter:
    """The recorder's writer in these tests: one line per row it is given, in a file the test
    reads (the recorder is another process). `stall`: the first row blocks it for a minute."""

    def __init__(self, path: Path, stall: bool = False) -> None:
        self.path = path
        self.stall = stall

    def submit(self, row: OutcomeRow) -> None:
        with self.path.open("a") as out:
            out.write(f"{row.key.tool_call_id} {row.outcome.result}\n")
        if self.stall:
            time.sleep(60)

    def write_batch(self, rows: list[OutcomeRow]) -> None:
        for row in rows:
            self.submit(row)

    def flush(self, timeout: float = 10.0) -> bool:
        with self.path.open("a") as out:
            out.write("flushed\n")
        return True


def _channel(path: Path, stall: bool = False) -> OutcomeChannel:
    return OutcomeChannel(lambda: FileWriter(path, stall))  # type: ignore[arg-type, return-value]


def _fork(body: Callable[[], int]) -> int:
    pid = os.fork()
    if pid == 0:  # a pool process: run, then leave without the parent's atexit work
        code = 1
        try:
            code = body()
        finally:
            os._exit(code)
    return pid


def _exit_code(pid: int) -> int:
    _, status = os.waitpid(pid, 0)
    return os.waitstatus_to_exitcode(status)


def _lines(path: Path) -> list[str]:
    return path.read_text().splitlines() if path.exists() else []


def test_rows_of_several_pool_processes_are_written_whole_and_once(tmp_path: Path) -> None:
    out = tmp_path / "rows"
    channel = _channel(out)
    per_child = 300

    def send_all(base: int) -> Callable[[], int]:
        def body() -> int:
            for i in range(per_child):
                # A burst may fill the pipe faster than the recorder reads: refused, not lost
                # (a worker writes that row itself); here the process offers it again.
                deadline = time.monotonic() + 10
                while not channel.send(_row(base + i, f"r{base + i}")):
                    if time.monotonic() > deadline:
                        return 3
                    time.sleep(0.001)
            return 0

        return body

    pids = [_fork(send_all(k * per_child)) for k in range(3)]
    assert [_exit_code(p) for p in pids] == [0, 0, 0]
    # Closing the main process's end lets the recorder write what it holds and exit.
    assert channel.close(timeout=30)
    lines = _lines(out)
    assert lines[-1] == "flushed"
    rows = [line.split() for line in lines[:-1]]
    assert sorted(int(key[1:]) for key, _ in rows) == list(range(3 * per_child))
    assert all(result == f"r{key[1:]}" for key, result in rows)


def test_the_main_process_and_a_long_row_are_written_where_they_are(tmp_path: Path) -> None:
    out = tmp_path / "rows"
    channel = _channel(out)
    assert channel.send(_row(1)) is False  # the main process has no one to hand to
    long_result = "x" * select.PIPE_BUF  # more than one atomic pipe write
    assert _exit_code(_fork(lambda: 0 if channel.send(_row(2, long_result)) is False else 4)) == 0
    assert channel.close(timeout=30)
    assert _lines(out) == ["flushed"]


def test_a_full_pipe_is_refused_not_waited_on(tmp_path: Path) -> None:
    """A recorder far behind (here: stuck on its first row) never holds a task: once the pipe
    is full, `send` answers False at once and the pool process writes the row itself."""
    channel = _channel(tmp_path / "rows", stall=True)

    def fill() -> int:
        for i in range(100_000):
            if not channel.send(_row(i, "y" * 2000)):
                return 0
        return 5

    try:
        assert _exit_code(_fork(fill)) == 0
        assert channel.close(timeout=0.5) is False  # still stuck
    finally:
        os.kill(channel.recorder_pid, signal.SIGKILL)
        os.waitpid(channel.recorder_pid, 0)


def test_a_killed_recorder_is_refused_and_ignores_sigterm(tmp_path: Path) -> None:
    """SIGTERM (a warm stop of the process group) does not stop the recorder before it has
    written what the pool sends; once SIGKILLed, pool processes write their own rows."""
    out = tmp_path / "rows"
    channel = _channel(out)
    os.kill(channel.recorder_pid, signal.SIGTERM)
    assert _exit_code(_fork(lambda: 0 if channel.send(_row(7, "after-term")) else 6)) == 0
    deadline = time.monotonic() + 20
    while "c7 after-term" not in _lines(out):
        assert time.monotonic() < deadline, _lines(out)
        time.sleep(0.01)

    os.kill(channel.recorder_pid, signal.SIGKILL)
    os.waitpid(channel.recorder_pid, 0)
    assert _exit_code(_fork(lambda: 0 if channel.send(_row(8)) is False else 7)) == 0
    assert channel.close(timeout=5)


@pytest.mark.parametrize(
    "trace", [None, {"traceparent": "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"}]
)
@pytest.mark.parametrize(
    "outcome",
    [
        Outcome(
            CallStatus.SUCCEEDED, "", result='{"n":1}', attempts=2, attempt_log="[]", decided_at=1.5
        ),
        Outcome(CallStatus.FAILED, "no such order"),
        Outcome(CallStatus.OUTCOME_UNKNOWN, "lost", did_not_run=True),
    ],
)
def test_a_row_crosses_the_pipe_unchanged(outcome: Outcome, trace: dict[str, str] | None) -> None:
    row = OutcomeRow(CallKey.of("s1", "t1", "c1"), "noop", '{"a":"é"}', outcome, trace)
    assert decode_row(encode_row(row)) == row
