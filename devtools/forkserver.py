"""A fork server for the test suite's Python processes: Celery workers and `dex-celery` runs
start by forking a process that has already imported the stack, instead of a new interpreter.

Why: the suite starts several hundred Celery workers and `dex-celery` commands; each new
interpreter spends about 0.7 CPU-seconds importing Celery, Kombu, redis-py, SQLAlchemy and
dex-celery before it does anything, which on the 2-core CI machine was most of the suite's CPU
(docs/testing.md, "Where the time goes"). The server imports those modules once (never the
test tools' app, which builds its `Dex` from the environment) and forks a child per request;
the child takes the request's environment, working folder, arguments and output files, then
runs the module (`python -m <module>`) or the console script's function as a new interpreter
would (its working folder first on `sys.path`, then the request's `PYTHONPATH`). What the test
sees is a process like any other: its own pid, session and process group
(`start_new_session`), SIGKILLed when the server dies (the parent-death signal, as
`dex_celery.processes.parent_death` gives every process the tests start), its exit status as
`subprocess.Popen.returncode` gives it (negative: the signal that ended it).

A request the server cannot serve faithfully is run as before, by `subprocess.Popen`: a working
folder holding its own copy of a module the server imported (a test that runs an older release
of the package from its own folder), an interpreter option in the environment (`PYTHON*` other
than `PYTHONPATH`), a `PYTHONPATH` entry holding a startup hook (`sitecustomize`: the clock-skew
tests' shim), or a pool that monkey-patches the standard library at start (gevent, eventlet:
the patch must come before the imports the server made). `DEX_TEST_FORKSERVER=1` turns the
server on (`tests/conftest.py` sets it); the benchmarks never use it.
"""

from __future__ import annotations

import atexit
import contextlib
import ctypes
import importlib
import json
import os
import runpy
import select
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import threading
import time
import traceback
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

#: The switch: the test suite's processes fork from the server only where this is "1".
ENABLE_ENV = "DEX_TEST_FORKSERVER"
#: What the server imports before it forks: what every worker and command imports anyway.
PRELOAD = (
    "celery",
    "celery.app",
    "celery.apps.worker",
    "celery.bin.celery",
    "celery.concurrency.prefork",
    "celery.concurrency.thread",
    "celery.worker",
    "celery.worker.consumer",
    "billiard",
    "kombu",
    "kombu.transport.redis",
    "redis",
    "sqlalchemy",
    "sqlalchemy.orm",
    "sqlalchemy.dialects.sqlite",
    "sqlalchemy.dialects.postgresql",
    "click",
    "pydantic",
    "alembic",
    "dex_celery",
    "dex_celery.app",
    "dex_celery.cli",
)
#: Environment variables the interpreter reads only when it starts: a request that changes one
#: is run as a new interpreter.
_STARTUP_ONLY = "PYTHON"
#: Modules the interpreter runs from `sys.path` when it starts, which a fork would skip.
_STARTUP_HOOKS = ("sitecustomize", "usercustomize")
_HEADER = struct.Struct("!I")
_PR_SET_PDEATHSIG = 1


# --- the server ------------------------------------------------------------------------------


def _serve(path: str) -> None:
    for name in PRELOAD:
        with contextlib.suppress(ImportError):
            importlib.import_module(name)
    parent = os.getppid()
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(path)
    listener.listen(64)
    wake_r, wake_w = os.pipe()
    os.set_blocking(wake_w, False)
    signal.set_wakeup_fd(wake_w)
    signal.signal(signal.SIGCHLD, lambda *_: None)
    exit_files: dict[int, str] = {}
    Path(path + ".ready").touch()
    while os.getppid() == parent:
        readable, _, _ = select.select([listener, wake_r], [], [], 0.5)
        if wake_r in readable:
            with contextlib.suppress(BlockingIOError):
                os.read(wake_r, 4096)
        _reap(exit_files)
        if listener in readable:
            conn, _ = listener.accept()
            with conn:
                try:
                    request, fds = _receive(conn)
                except (OSError, ValueError):
                    continue
                pid = os.fork()
                if pid == 0:
                    _child(request, fds, (listener, conn), (wake_r, wake_w))
                for fd in fds:
                    os.close(fd)
                exit_files[pid] = request["exit_file"]
                conn.sendall(_HEADER.pack(pid))


def _reap(exit_files: dict[int, str]) -> None:
    while exit_files:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        target = exit_files.pop(pid, None)
        if target is not None:
            tmp = f"{target}.tmp"
            Path(tmp).write_text(str(os.waitstatus_to_exitcode(status)))
            os.replace(tmp, target)


def _receive(conn: socket.socket) -> tuple[dict[str, Any], list[int]]:
    head, fds, _, _ = socket.recv_fds(conn, _HEADER.size, 4)
    (size,) = _HEADER.unpack(_read_exactly(conn, _HEADER.size, head))
    return json.loads(_read_exactly(conn, size)), list(fds)


def _read_exactly(conn: socket.socket, size: int, start: bytes = b"") -> bytes:
    """`size` bytes from `conn` (`start`: those read already); `ConnectionError` if it closes."""
    data = start
    while len(data) < size:
        more = conn.recv(size - len(data))
        if not more:
            raise ConnectionError("the other side closed the connection mid-message")
        data += more
    return data


def _child(
    request: dict[str, Any],
    fds: list[int],
    sockets: tuple[socket.socket, ...],
    pipes: tuple[int, ...],
) -> None:
    """Become the requested process; never returns (`os._exit`)."""
    code = 1
    try:
        os.setsid()
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
        signal.set_wakeup_fd(-1)
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
        for sock in sockets:
            sock.close()
        for fd in pipes:
            os.close(fd)
        null = os.open(os.devnull, os.O_RDONLY)
        os.dup2(null, 0)
        os.close(null)
        os.dup2(fds[0], 1)
        os.dup2(fds[1], 2)
        for fd in set(fds):
            os.close(fd)
        os.chdir(request["cwd"])
        os.environ.clear()
        os.environ.update(request["env"])
        extra = [p for p in request["env"].get("PYTHONPATH", "").split(os.pathsep) if p]
        base = [p for p in sys.path[1:] if p not in request["server_pythonpath"]]
        sys.path[:] = [request["cwd"], *extra, *base]
        code = _run(request)
    except BaseException:  # the child's own report, as an interpreter's
        traceback.print_exc()
    finally:
        with contextlib.suppress(BaseException):
            sys.stdout.flush()
            sys.stderr.flush()
        os._exit(code)


def _run(request: dict[str, Any]) -> int:
    """Run the module or function as `python -m` or a console script would; the exit code."""
    try:
        if request.get("module"):
            sys.argv = [request["module"], *request["args"]]
            runpy.run_module(request["module"], run_name="__main__", alter_sys=True)
        else:
            module, _, function = request["function"].partition(":")
            sys.argv = [request["argv0"], *request["args"]]
            result = getattr(importlib.import_module(module), function)()
            return _finish(_exit_code(result))
        code = 0
    except SystemExit as e:
        code = _exit_code(e.code)
    return _finish(code)


def _finish(code: int) -> int:
    """What an interpreter does at its exit: wait for non-daemon threads, run `atexit`."""
    threading_shutdown = getattr(threading, "_shutdown", None)
    if threading_shutdown is not None:
        threading_shutdown()
    atexit._run_exitfuncs()
    return code


def _exit_code(value: object) -> int:
    if value is None:
        return 0
    if isinstance(value, int):
        return value
    print(value, file=sys.stderr)
    return 1


# --- the client ------------------------------------------------------------------------------


class ForkedProcess:
    """A process the server forked, with the `subprocess.Popen` methods the tests use."""

    def __init__(self, pid: int, args: Sequence[str], exit_file: Path) -> None:
        self.pid = pid
        self.args = list(args)
        self.returncode: int | None = None
        self._exit_file = exit_file

    def poll(self) -> int | None:
        if self.returncode is None:
            try:
                self.returncode = int(self._exit_file.read_text())
            except (OSError, ValueError):
                return None
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        deadline = None if timeout is None else time.monotonic() + timeout
        delay = 0.005
        while self.poll() is None:
            if deadline is not None and time.monotonic() >= deadline:
                raise subprocess.TimeoutExpired(self.args, timeout or 0.0)
            time.sleep(delay)
            delay = min(delay * 2, 0.05)
        assert self.returncode is not None
        return self.returncode

    def send_signal(self, sig: int) -> None:
        if self.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.pid, sig)

    def terminate(self) -> None:
        self.send_signal(signal.SIGTERM)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)


class _Server:
    """This process's fork server, started on first use from the thread that first asks (its
    parent-death signal follows that thread: the tests' main thread)."""

    _lock = threading.Lock()
    _instance: _Server | None = None

    def __init__(self) -> None:
        from dex_celery.processes.parent_death import popen_with_parent_death

        self.folder = Path(tempfile.mkdtemp(prefix="dex-forkserver-"))
        self.path = str(self.folder / "socket")
        self.pythonpath = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
        root = Path(__file__).resolve().parents[1]
        self.process = popen_with_parent_death(
            [sys.executable, "-m", "devtools.forkserver", self.path],
            cwd=root,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=(self.folder / "server.log").open("wb"),
        )
        deadline = time.monotonic() + 60
        while not Path(self.path + ".ready").exists():
            if self.process.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(
                    f"the fork server did not start: {(self.folder / 'server.log').read_text()}"
                )
            time.sleep(0.02)
        self.exits = 0

    @classmethod
    def get(cls) -> _Server | None:
        """The running server; started here only from the main thread, else None."""
        with cls._lock:
            if cls._instance is None or cls._instance.process.poll() is not None:
                if threading.current_thread() is not threading.main_thread():
                    return None
                cls._instance = cls()
            return cls._instance

    def spawn(
        self, request: dict[str, Any], stdout: int, stderr: int, args: Sequence[str]
    ) -> ForkedProcess:
        with self._lock:
            self.exits += 1
            exit_file = self.folder / f"exit-{self.exits}"
        request = {**request, "exit_file": str(exit_file), "server_pythonpath": self.pythonpath}
        body = json.dumps(request).encode()
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as conn:
            conn.connect(self.path)
            socket.send_fds(conn, [_HEADER.pack(len(body))], [stdout, stderr])
            conn.sendall(body)
            (pid,) = _HEADER.unpack(_read_exactly(conn, _HEADER.size))
        return ForkedProcess(pid, args, exit_file)


def _shadows_preloaded(folder: Path) -> bool:
    """Whether `folder` holds a module or package of a name the server imported already."""
    roots = {name.partition(".")[0] for name in PRELOAD} | {"devtools"}
    return any((folder / name).is_dir() or (folder / f"{name}.py").exists() for name in roots)


def start() -> None:
    """Start this process's server now (from the main thread: `tests/conftest.py`)."""
    if os.environ.get(ENABLE_ENV) == "1":
        _Server.get()


def usable(env: Mapping[str, str], cwd: Path | None, root: Path) -> bool:
    """Whether a process with this environment and folder may be forked from the server."""
    if os.environ.get(ENABLE_ENV) != "1" or env.get(ENABLE_ENV) == "0":
        return False
    if _Server.get() is None:
        return False
    if cwd is not None and Path(cwd).resolve() != root and _shadows_preloaded(Path(cwd)):
        return False  # a folder holding its own copy of the package (an older release)
    added = [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p and p not in sys.path]
    if any((Path(p) / f"{name}.py").exists() for p in added for name in _STARTUP_HOOKS):
        return False  # a startup hook (the clock-skew shim) runs only in a new interpreter
    return all(
        env.get(name) == os.environ.get(name)
        for name in {*env, *os.environ}
        if name.startswith(_STARTUP_ONLY) and name != "PYTHONPATH"
    )


def spawn_module(
    module: str,
    args: Sequence[str],
    *,
    env: Mapping[str, str],
    cwd: Path,
    stdout: int,
    stderr: int,
) -> ForkedProcess:
    """`python -m <module> <args>` forked from the server, output to the given descriptors."""
    request = {"module": module, "args": list(args), "env": dict(env), "cwd": str(cwd)}
    server = _Server.get()
    assert server is not None, "check `usable` first"
    return server.spawn(request, stdout, stderr, [sys.executable, "-m", module, *args])


def run_function(
    function: str,
    argv0: str,
    args: Sequence[str],
    *,
    env: Mapping[str, str],
    cwd: Path,
    timeout: float,
) -> subprocess.CompletedProcess[str]:
    """A console script (`module:function`) run as `subprocess.run(..., capture_output=True,
    text=True, timeout=...)` would run it."""
    out_r, out_w = os.pipe()
    err_r, err_w = os.pipe()
    request = {
        "function": function,
        "argv0": argv0,
        "args": list(args),
        "env": dict(env),
        "cwd": str(cwd),
    }
    server = _Server.get()
    assert server is not None, "check `usable` first"
    try:
        process = server.spawn(request, out_w, err_w, [argv0, *args])
    finally:
        os.close(out_w)
        os.close(err_w)
    chunks: dict[int, list[bytes]] = {out_r: [], err_r: []}

    def drain(fd: int) -> None:
        with os.fdopen(fd, "rb") as stream:
            chunks[fd].append(stream.read())

    readers = [threading.Thread(target=drain, args=(fd,), daemon=True) for fd in chunks]
    for reader in readers:
        reader.start()
    try:
        code = process.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)
        process.wait(timeout=10)
        raise
    for reader in readers:
        reader.join(timeout=10)
    out, err = (b"".join(chunks[fd]).decode(errors="replace") for fd in (out_r, err_r))
    return subprocess.CompletedProcess([argv0, *args], code, out, err)


if __name__ == "__main__":
    _serve(sys.argv[1])
