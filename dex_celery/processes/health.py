"""The worker's `/readyz` and `/livez`, served on its metrics port (`ops.metrics`).

- `/readyz`: 200 once the worker is ready (Celery's `worker_ready`) and its database, Redis
  ledger and broker answer now (`ops.probes.readiness`); 503 otherwise.
- `/livez`: 200 while the worker's main loop ticks (`ops.probes.LoopTick`); 503 before its
  first tick and once it has stopped. It asks no backend: an outage of Redis or the database
  must not restart workers whose tools are running (docs/operations.md, "Probes").

Both answer after the door's `Host` check and without credentials (the kubelet has none): the
body says `ok`, or which part failed and its error type, never data (docs/security.md).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import TYPE_CHECKING, Any

from dex_celery.errors import NotAlive
from dex_celery.ops.probes import LoopTick, readiness

if TYPE_CHECKING:
    from dex_celery.engine import RuntimeSource

WsgiApp = Callable[[dict[str, Any], Callable[..., Any]], Iterable[bytes]]

#: The paths of the worker's health door.
READY_PATH = "/readyz"
LIVE_PATH = "/livez"


def _answer(start_response: Callable[..., Any], ok: bool, text: str) -> list[bytes]:
    body = (text + "\n").encode()
    start_response(
        "200 OK" if ok else "503 Service Unavailable",
        [
            ("Content-Type", "text/plain; charset=utf-8"),
            ("Content-Length", str(len(body))),
            ("Cache-Control", "no-store"),
        ],
    )
    return [body]


def health_routes(
    source: RuntimeSource, tick: LoopTick, is_ready: Callable[[], bool]
) -> Mapping[str, WsgiApp]:
    """The two paths and their WSGI apps; `is_ready`: whether the worker has said `ready`."""

    def readyz(_environ: dict[str, Any], start_response: Callable[..., Any]) -> list[bytes]:
        if not is_ready():
            return _answer(start_response, False, "not ready: starting")
        verdict, _error = readiness(source)
        return _answer(start_response, verdict.ok, verdict.text())

    def livez(_environ: dict[str, Any], start_response: Callable[..., Any]) -> list[bytes]:
        try:
            text = tick.require_alive()
        except NotAlive as e:
            return _answer(start_response, False, f"not alive: {e}")
        return _answer(start_response, True, f"ok: {text}")

    return {READY_PATH: readyz, LIVE_PATH: livez}
