"""A worker's own metrics port is a network door too (S11.3, docs/security.md): loopback unless
set otherwise, never beyond loopback without credentials, only allowed `Host` names, and with
credentials configured only for a token or person with the scope `metrics`. Served here by
`serve_worker_metrics` (what a worker's main process runs) on a real socket."""

from __future__ import annotations

import httpx
import pytest

from devtools.processes import free_port, wait_for
from devtools.toolapp import make_app
from dex_celery import Settings
from dex_celery.errors import ConfigurationError
from dex_celery.ops.metrics import serve_worker_metrics


def _up(url: str) -> bool:
    try:
        httpx.get(url, timeout=1)
    except httpx.HTTPError:
        return False
    return True


def test_worker_metrics_port_checks_host_token_and_scope(env: dict[str, str]) -> None:
    port = free_port()
    settings = Settings.from_env(
        env,
        worker_metrics_port=port,
        web_tokens="prom:prom-tok,agent:agent-tok:tools:call",
    )
    _app, dex = make_app(settings)
    dex.store.create_schema()
    serve_worker_metrics(dex)
    url = f"http://127.0.0.1:{port}/metrics"
    wait_for(lambda: _up(url), timeout=10, what="the worker metrics port")

    assert httpx.get(url).status_code == 401
    assert httpx.get(url, headers={"Authorization": "Bearer nope"}).status_code == 401
    assert httpx.get(url, headers={"Authorization": "Bearer agent-tok"}).status_code == 403
    ok = httpx.get(url, headers={"Authorization": "Bearer prom-tok"})
    assert ok.status_code == 200 and "dex_metrics_source_up" in ok.text
    forged = httpx.get(
        url, headers={"Authorization": "Bearer prom-tok", "Host": "rebind.attacker.example"}
    )
    assert forged.status_code == 421


def test_worker_metrics_port_stays_on_loopback_without_credentials(env: dict[str, str]) -> None:
    _app, dex = make_app(
        Settings.from_env(env, worker_metrics_port=free_port(), worker_metrics_host="0.0.0.0")
    )
    with pytest.raises(ConfigurationError, match="without authentication"):
        serve_worker_metrics(dex)
    assert Settings().worker_metrics_host == "127.0.0.1"


def test_the_health_paths_answer_without_a_token_but_check_the_host(env: dict[str, str]) -> None:
    """`/readyz` and `/livez` (processes/health.py) are asked by a kubelet without credentials:
    they answer without a token, after the `Host` check, and show no data; `/metrics` beside
    them still wants its token (docs/operations.md, "Probes")."""
    from dex_celery.ops.probes import LoopTick
    from dex_celery.processes.health import health_routes

    port = free_port()
    settings = Settings.from_env(env, worker_metrics_port=port, web_tokens="prom:prom-tok")
    _app, dex = make_app(settings)
    dex.store.create_schema()
    tick = LoopTick()
    serve_worker_metrics(dex, health_routes(dex, tick, lambda: True))
    base = f"http://127.0.0.1:{port}"
    wait_for(lambda: _up(base + "/livez"), timeout=10, what="the worker metrics port")

    assert httpx.get(base + "/metrics").status_code == 401
    starting = httpx.get(base + "/livez")
    assert (starting.status_code, starting.text) == (
        503,
        "not alive: the worker's main loop has not started yet\n",
    )
    tick.tick()
    assert httpx.get(base + "/livez").status_code == 200
    ready = httpx.get(base + "/readyz")
    assert (ready.status_code, ready.text) == (200, "ready (database, redis, broker)\n")
    assert (
        httpx.get(base + "/readyz", headers={"Host": "rebind.attacker.example"}).status_code == 421
    )
