"""`dex-celery probe ready|live`: the deployment's readiness and liveness checks as exec probes.

- `probe ready`: the database (schema at a revision this code runs on), the Redis ledger and the
  broker answer now, asked from this process (`ops.probes.readiness`); `--worker` asks the
  worker on this host instead (its `/readyz`: ready, and the same three answer from it);
- `probe live`: the worker on this host is alive (its `/livez`: its main loop ticks); it asks
  no backend, so an outage never restarts a worker with tools running;
- `probe live --beat`: beat's sweeper sweeps (the last sweep in the ledger is recent).

Exit status 0 with one line on stdout, or 1 with one `error:` line (docs/operations.md,
"Probes"). The worker's door is `worker_metrics_host`:`worker_metrics_port` (loopback by
default; a pod's own address in deploy/kubernetes/worker.yaml).
"""

from __future__ import annotations

import http.client

import click

from dex_celery.cli.context import DexContext, pass_context
from dex_celery.errors import ConfigurationError, NotAlive
from dex_celery.ops.probes import readiness, require_sweeps
from dex_celery.processes.health import LIVE_PATH, READY_PATH
from dex_celery.settings import Settings

#: Seconds the probe waits for the worker's door.
DOOR_TIMEOUT = 10.0


@click.group("probe")
def probe() -> None:
    """Readiness and liveness checks for container probes (exit status 0 or 1)."""


@probe.command("ready")
@click.option("--worker", is_flag=True, help="Ask the worker on this host (its /readyz).")
@pass_context
def ready(ctx: DexContext, worker: bool) -> None:
    """The database, the Redis ledger and the broker answer now (with --worker: the worker on
    this host is ready and they answer it)."""
    if worker:  # the worker answers for its database: this process never opens it
        click.echo(_ask_worker(ctx.load(check_database=False).settings, READY_PATH))
        return
    dex = ctx.dex
    verdict, error = readiness(dex)
    if error is not None:
        raise error
    click.echo(verdict.text())


@probe.command("live")
@click.option("--beat", is_flag=True, help="Check beat's sweeper instead of the worker.")
@pass_context
def live(ctx: DexContext, beat: bool) -> None:
    """The worker on this host is alive (its main loop ticks); with --beat, beat's sweeper
    swept recently."""
    if beat:
        click.echo(require_sweeps(ctx.dex))
        return
    click.echo(_ask_worker(ctx.load(check_database=False).settings, LIVE_PATH))


def _ask_worker(settings: Settings, path: str) -> str:
    """GET `path` of the worker's door on this host; its one-line answer, or `NotAlive`."""
    port = settings.worker_metrics_port
    if not port:
        raise ConfigurationError(
            "the worker's health door is off: set DEX_WORKER_METRICS_PORT for the worker and "
            "for this probe (docs/operations.md, Probes)"
        )
    host = settings.worker_metrics_host.strip("[]")
    if host in ("0.0.0.0", "::"):
        host = "127.0.0.1" if host == "0.0.0.0" else "::1"
    conn = http.client.HTTPConnection(host, port, timeout=DOOR_TIMEOUT)
    try:
        conn.request("GET", path, headers={"Host": _host_header(host, port)})
        answer = conn.getresponse()
        text = answer.read(500).decode(errors="replace").strip()
    except OSError as e:
        raise NotAlive(
            f"the worker's door at {host} port {port} did not answer {path}: {e}"
        ) from None
    finally:
        conn.close()
    if answer.status != 200:
        raise NotAlive(f"the worker answered {path} with {answer.status}: {text}")
    return text


def _host_header(host: str, port: int) -> str:
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
