"""`dex-celery demo`: a scripted agent session on the order desk, one call of each outcome.

The model (scripted here) asks in one turn for four calls:

| call                          | what happens                                         | outcome           |
|-------------------------------|------------------------------------------------------|-------------------|
| `lookup_order(A)`             | a worker runs it                                     | `succeeded`       |
| `print_shipping_label(A)`     | no label-printer worker serves the `labels` queue;   | `failed`: the tool|
|                               | the attempt expires in the queue                     | did not run (S4.2)|
| `cancel_order(C)`             | a person rejects it                                  | `rejected` (S6.2) |
| `cancel_order(B)`             | approved; the worker process running it is SIGKILLed | `outcome_unknown` |
|                               | while it waits for the bank to confirm the refund    | (S4.3)            |

Then one reconciliation pass asks the desk what happened to the unknown call and tells the
session (S8.1); a second pass sends nothing new (S8.2).
"""

from __future__ import annotations

import logging
import os
import signal
import sys
import time
import uuid
from dataclasses import dataclass
from enum import Enum

import click
from celery import Celery

from dex_celery import CallRequest, CallStatus, Dex, MessageRole, ToolCallRecord
from dex_celery.engine import parse_owner, reconcile_once
from dex_celery.errors import LedgerMismatch
from dex_celery.examples.orderdesk.desk import DEMO_ORDERS, OrderDesk
from dex_celery.examples.orderdesk.factory import create_app
from dex_celery.ops.present import render_table, shorten
from dex_celery.processes.localstack import (
    LocalStack,
    PrerequisiteMissing,
    expanded_node_name,
    prepare_database,
    worker_answers,
)
from dex_celery.settings import Settings
from dex_celery.tools.redact import record_arguments

#: The module the demo's worker imports (`celery -A`): the order desk shipped in the package.
APP_MODULE = "dex_celery.examples.orderdesk.app"
APPROVER = "ops@orderdesk.example"


class DemoResult(Enum):
    """How the demo ended; the CLI maps each to its exit code."""

    OK = "ok"
    PREREQUISITE_MISSING = "prerequisite_missing"
    FAILED = "failed"


EXPECTED = ("succeeded", "failed", "rejected", "outcome_unknown")


@dataclass(frozen=True, slots=True)
class Scenario:
    """The session's four calls, by the outcome each is meant to show."""

    session_id: str
    succeeded: str
    failed: str
    rejected: str
    unknown: str

    @property
    def keys(self) -> list[str]:
        return [self.succeeded, self.failed, self.rejected, self.unknown]


class Progress:
    """One line that updates in place on a terminal; one line per change elsewhere."""

    def __init__(self) -> None:
        self.tty = sys.stdout.isatty()
        self.started = time.monotonic()
        self.last = ""

    def show(self, text: str) -> None:
        line = f"  [{time.monotonic() - self.started:5.1f}s] {text}"
        if self.tty:
            click.echo("\r\033[K" + line, nl=False)
        elif text != self.last:
            click.echo(line)
        self.last = text

    def done(self) -> None:
        if self.tty:
            click.echo()


def run_demo(settings: Settings, *, timeout: float) -> DemoResult:
    """Start the local stack, run the scripted session on it, print the outcome table and the
    reconciliation report, stop the stack. `settings`: the deployment's, with the stack's Redis
    put in once it runs."""
    echo = click.echo
    # The demo prints what happens itself; the library's warnings (a surfaced unknown outcome,
    # a lost worker) are the operators' log lines and would only repeat it here.
    logging.getLogger("dex_celery").setLevel(logging.ERROR)
    started = time.monotonic()
    echo("dex-celery demo: an agent session on the order desk, one call of each outcome\n")
    stack = LocalStack(APP_MODULE, quiet=True, echo=lambda m: echo(f"  {m}"))
    try:
        try:
            stack.start_redis()
        except PrerequisiteMissing as e:
            echo(f"error: {e}", err=True)
            return DemoResult.PREREQUISITE_MISSING
        settings = stack.settings(settings)
        celery, dex, desk = create_app(settings)
        prepare_database(settings, lambda m: echo(f"  {m}"))
        # The look every process makes first (LedgerMismatch), before the worker and beat
        # start: a refusal is then one line, not also theirs.
        dex.runtime.epoch.current()
        stack.start_celery()
        _wait_for_worker(celery, stack)
        scenario = _request_calls(dex, desk)
        records = _drive(dex, desk, scenario, timeout)
        echo()
        echo(_table(records, scenario))
        echo()
        _reconcile(dex, scenario)
        return _conclude(records, scenario, settings, time.monotonic() - started)
    except LedgerMismatch as e:
        # What is wrong and how to recover, in one line; the services' logs only repeat it.
        hint = str(e).replace("`dex-celery db ", f"`dex-celery -A {APP_MODULE} db ")
        echo(f"\nerror: LedgerMismatch: {hint}", err=True)
        return DemoResult.FAILED
    except Exception as e:
        echo(f"\nerror: {type(e).__name__}: {e}", err=True)
        for name in ("worker", "beat"):
            tail = stack.log_of(name)[-3000:]
            if tail:
                echo(f"--- last lines of the {name} log ---\n{tail}", err=True)
        return DemoResult.FAILED
    finally:
        echo("\nstopping the local stack...")
        stack.stop()


def _wait_for_worker(celery: Celery, stack: LocalStack) -> None:
    node = expanded_node_name(stack.worker_name)
    progress = Progress()
    progress.show("waiting for the worker to start...")
    stack.wait_for_worker(lambda: worker_answers(celery, node))
    progress.show("the worker is ready")
    progress.done()


def _conclude(
    records: list[ToolCallRecord], scenario: Scenario, settings: Settings, took: float
) -> DemoResult:
    outcomes = {r.status.value for r in records}
    missing = [o for o in EXPECTED if o not in outcomes]
    click.echo()
    if missing:
        click.echo(f"error: the demo did not show {', '.join(missing)}", err=True)
        return DemoResult.FAILED
    click.echo(
        f"demo finished in {took:.1f}s. "
        f"Inspect a call: dex-celery -A {APP_MODULE} calls show {scenario.unknown} "
        f"(with DEX_DATABASE_URL={settings.database_url})"
    )
    return DemoResult.OK


def _request_calls(dex: Dex, desk: OrderDesk) -> Scenario:
    a, b, c = (desk.add_order(**spec) for spec in DEMO_ORDERS)  # type: ignore[arg-type]
    session_id = f"demo-{time.strftime('%Y%m%d-%H%M%S')}-{uuid.uuid4().hex[:4]}"
    client = dex.client()
    client.open_session(session_id)
    client.add_message(
        session_id,
        MessageRole.USER,
        f"{b.customer} wants order {b.id} cancelled, and {c.customer} says order {c.id} was a "
        f"mistake. Also, where is order {a.id}? Print its shipping label.",
    )
    client.add_message(
        session_id,
        MessageRole.ASSISTANT,
        f"I'll look up order {a.id}, print its label, and cancel orders {b.id} and {c.id}.",
    )
    turn = "turn-1"
    requests = [
        CallRequest(session_id, turn, "call-1", "lookup_order", {"order_id": a.id}),
        CallRequest(session_id, turn, "call-2", "print_shipping_label", {"order_id": a.id}),
        CallRequest(
            session_id, turn, "call-3", "cancel_order", {"order_id": c.id, "reason": "a mistake"}
        ),
        CallRequest(
            session_id,
            turn,
            "call-4",
            "cancel_order",
            {"order_id": b.id, "reason": "the customer asked"},
        ),
    ]
    records = client.request_calls(requests)
    echo = click.echo
    echo(f"\nsession {session_id}: the model asks for {len(records)} calls in one turn")
    for r in records:
        echo(f"  {r.key:<40} {r.tool_name:<22} {r.effect.value:<22} -> {r.status.value}")
    return Scenario(session_id, *(r.key for r in records))


def _drive(dex: Dex, desk: OrderDesk, scenario: Scenario, timeout: float) -> list[ToolCallRecord]:
    """Decide the approvals, kill the worker mid-call, and wait for all four to end."""
    client = dex.client()
    echo = click.echo
    rejected = client.reject(scenario.rejected, APPROVER, "the customer called: keep the order")
    echo(f"  {APPROVER} rejects {rejected.key} -> {rejected.status.value}")
    client.approve(scenario.unknown, APPROVER, "refund by bank transfer is fine")
    echo(f"  {APPROVER} approves {scenario.unknown}; it runs")
    progress = Progress()
    deadline = time.monotonic() + timeout
    killed = False
    while True:
        records = [client.get_call(k) for k in scenario.keys]
        if not killed:
            killed = _kill_when_running(dex, desk, scenario.unknown, progress)
        progress.show(_status_line(records, killed))
        if all(r.finished for r in records):
            progress.done()
            return records
        if time.monotonic() > deadline:
            progress.done()
            raise TimeoutError(
                f"calls still in flight after {timeout}s: {_status_line(records, killed)}"
            )
        time.sleep(0.2)


def _kill_when_running(dex: Dex, desk: OrderDesk, key: str, progress: Progress) -> bool:
    """SIGKILL the pool process running `key` once the desk recorded the cancellation, while
    the tool waits for the bank: the tool took effect, but the system cannot know that."""
    entry = dex.ledger.read(key)
    if entry is None or entry.state != "running" or not entry.owner:
        return False
    if not desk.operations(key):
        return False
    owner = parse_owner(entry.owner)
    pid = owner.pid
    if pid is None or not owner.is_here():
        raise RuntimeError(f"{key} runs on {entry.owner}, not on this machine: cannot kill it")
    progress.show(f"cancel_order is waiting for the bank: SIGKILL worker process {pid}")
    progress.done()
    os.kill(pid, signal.SIGKILL)
    click.echo(f"  killed worker process {pid} (SIGKILL) in the middle of {key}")
    return True


def _status_line(records: list[ToolCallRecord], killed: bool) -> str:
    ended = sum(r.finished for r in records)
    states = ", ".join(f"{r.tool_call_id} {r.status.value}" for r in records)
    return f"{ended}/{len(records)} ended: {states}"


def _table(records: list[ToolCallRecord], scenario: Scenario) -> str:
    rows = []
    for r in sorted(
        records, key=lambda r: EXPECTED.index(r.status.value) if r.status.value in EXPECTED else 9
    ):
        args = record_arguments(r)  # the one display rule (tools/redact.py)
        what = (r.result or "") if r.status is CallStatus.SUCCEEDED else (r.error or "")
        rows.append(
            [
                r.status.value,
                f"{r.tool_name}({args.get('order_id', '')})",
                r.effect.value,
                str(r.attempts),
                shorten(what, 90),
            ]
        )
    return render_table(
        ["OUTCOME", "CALL", "EFFECT CLASS", "ATTEMPTS", "WHAT THE MODEL READS"], rows
    )


def _reconcile(dex: Dex, scenario: Scenario) -> None:
    """One pass now (beat runs the same job periodically), then the reports the session got."""
    echo = click.echo
    echo("reconciliation report")
    report = reconcile_once(dex)
    reports = _reports(dex, scenario)
    echo(
        f"  this pass: surfaced {report.surfaced}, reported {report.reported}, "
        f"errors {report.errors}"
    )
    if not reports:
        echo("  no report was sent (the outcome check did not answer)")
    for text in reports:
        echo(f"  user message sent to the session: {text}")
    again = reconcile_once(dex)
    echo(f"  a second pass sends nothing new: reported {again.reported} (S8.2)")


def _reports(dex: Dex, scenario: Scenario) -> list[str]:
    snapshot = dex.client().get_agent_snapshot(scenario.session_id)
    return [
        m.text or ""
        for m in snapshot.messages
        if m.role is MessageRole.USER and scenario.unknown in (m.text or "")
    ]
