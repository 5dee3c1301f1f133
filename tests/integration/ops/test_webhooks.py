"""Webhooks: each event reaches a local receiver once, signed; a receiver that is down or hangs
gets retries with backoff and never slows the calls.

The first test runs the sender where production runs it: in a real `celery beat` process (the
thread its `beat_init` signal starts), fed by a real worker and a real redis-server.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import os
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from devtools.processes import ROOT, Worker, free_port, wait_for
from devtools.toolapp import executions, make_app
from dex_celery import CallStatus, Dex, Settings
from dex_celery.engine.upkeep.reconcile import reconcile_once
from dex_celery.ops.status import State, webhooks_section
from dex_celery.ops.webhooks import (
    DELIVERY_HEADER,
    EVENT_HEADER,
    SIGNATURE_HEADER,
    WebhookSender,
    delivery_status,
    render_status,
)
from tests.support.web.webhook_receiver import Receiver

SECRET = "hook-secret"


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    r = Receiver()
    yield r
    r.close()


def hooked_dex(env: dict[str, str], **settings: str) -> Dex:
    values = {**env, **settings}
    _app, dex = make_app(Settings.from_env(values))
    return dex


def test_each_event_reaches_the_receiver_once_with_a_valid_signature(
    dex: Dex,
    env: dict[str, str],
    receiver: Receiver,
    start_worker: Callable[..., Worker],
    sweeper: object,
    tmp_path: Path,
) -> None:
    hook_env = {
        "DEX_WEBHOOK_URLS": receiver.url,
        "DEX_WEBHOOK_SECRET": SECRET,
        "DEX_WEBHOOK_BACKOFF": "0.2",
    }
    hooked = hooked_dex(env, **hook_env)
    beat_log = tmp_path / "beat.log"
    with beat_log.open("wb") as out:
        beat = subprocess.Popen(
            [sys.executable, "-m", "celery", "-A", "devtools.toolapp", "beat", "-l", "info",
             "-s", str(tmp_path / "beat-schedule")],
            cwd=ROOT, env={**os.environ, **env, **hook_env}, stdout=out, stderr=subprocess.STDOUT,
        )  # fmt: skip
    try:
        client = hooked.ledger.client
        wait_for(
            lambda: client.exists(hooked.keys.webhook_cursor) or beat.poll() is not None,
            timeout=30,
            what="beat's webhook sender to start",
        )
        assert beat.poll() is None, beat_log.read_text()[-2000:]

        calls = hooked.client()
        waiting = calls.request_call("h", "t1", "approve-me", "guarded_write", {"value": 1})
        calls.reject(waiting.key, "alice", "not today")  # a rejection is not a webhook event
        calls.request_call("h", "t1", "ok", "echo", {"x": 1})  # nor is a success
        doomed = start_worker(concurrency=1)
        lost = calls.request_call("h", "t2", "lost", "slow_non_idempotent_write", {"seconds": 60})
        wait_for(lambda: executions(lost.key), timeout=20, what="the slow write to start")
        doomed.kill_all()
        calls.wait([lost.key], timeout=20)
        assert calls.get_call(lost.key).status is CallStatus.OUTCOME_UNKNOWN
        hooked.register_outcome_check(
            "slow_non_idempotent_write",
            lambda key, args: "Note from the test desk: it went through.",
        )
        assert reconcile_once(hooked).reported == 1

        wait_for(lambda: len(receiver.requests) >= 3, timeout=20, what="three webhooks")
        wait_for(lambda: delivery_status(hooked).pending == 0, timeout=10, what="nothing pending")
    finally:
        beat.terminate()
        beat.wait(timeout=10)

    assert len(receiver.requests) == 3, [json.loads(b) for _, b in receiver.requests]
    bodies = []
    for headers, body in receiver.requests:
        expected = "sha256=" + hmac.new(SECRET.encode(), body, hashlib.sha256).hexdigest()
        assert hmac.compare_digest(headers[SIGNATURE_HEADER], expected)
        payload = json.loads(body)
        assert headers[EVENT_HEADER] == payload["event"]
        bodies.append(payload)
    assert len({h[DELIVERY_HEADER] for h, _ in receiver.requests}) == 3
    by_event = {b["event"]: b for b in bodies}
    assert set(by_event) == {
        "tool_call_awaiting_approval",
        "outcome_unknown",
        "reconciliation_report",
    }
    approval = by_event["tool_call_awaiting_approval"]
    assert approval["key"] == waiting.key and approval["tool"] == "guarded_write"
    assert approval["arguments"] == {"value": 1} and approval["approval_deadline"] > time.time()
    unknown = by_event["outcome_unknown"]
    assert unknown["key"] == lost.key and unknown["status"] == "outcome_unknown"
    assert unknown["effect_class"] == "non_idempotent_write" and unknown["error"]
    report = by_event["reconciliation_report"]
    assert report["key"] == lost.key and "it went through" in report["report"]
    status = delivery_status(hooked)
    (row,) = status.receivers
    assert (row.delivered, row.retries, row.given_up, row.pending) == (3, 0, 0, 0)
    assert "token=abc" not in row.receiver  # the query (often a token) is never shown


class Hanging:
    """Accepts connections and never answers: a receiver that hangs."""

    def __init__(self) -> None:
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(64)
        self.url = f"http://127.0.0.1:{self.sock.getsockname()[1]}/hang"

    def close(self) -> None:
        self.sock.close()


def test_a_receiver_down_gets_retries_and_does_not_slow_the_calls(
    dex: Dex, env: dict[str, str], receiver: Receiver, start_worker: Callable[..., Worker]
) -> None:
    down = f"http://127.0.0.1:{free_port()}/down"  # nothing listens there
    hanging = Hanging()
    hooked = hooked_dex(
        env,
        DEX_WEBHOOK_URLS=f"{down},{hanging.url},{receiver.url}",
        DEX_WEBHOOK_SECRET=SECRET,
        DEX_WEBHOOK_BACKOFF="0.2",
        DEX_WEBHOOK_MAX_ATTEMPTS="4",
        DEX_WEBHOOK_TIMEOUT="1.5",
    )
    sender = WebhookSender(hooked)
    sender.start()  # what beat_init starts
    try:
        wait_for(lambda: hooked.ledger.client.exists(hooked.keys.webhook_cursor), timeout=10,
                 what="the sender to start")  # fmt: skip
        start_worker()
        calls = hooked.client()
        started = time.monotonic()
        keys = [
            calls.request_call("d", "t1", f"c{i}", "guarded_write", {"value": i}).key
            for i in range(5)
        ]
        for key in keys:
            calls.approve(key, "alice")
        records = calls.wait(keys, timeout=30)
        elapsed = time.monotonic() - started
        assert all(r.status is CallStatus.SUCCEEDED for r in records)
        # The calls are done while the deliveries to the dead receivers are still being
        # retried: nothing on the call's path waits for a receiver.
        still = {r.receiver: r for r in delivery_status(hooked).receivers}
        hang_row = next(r for name, r in still.items() if name.endswith("/hang"))
        assert hang_row.given_up == 0, (elapsed, still)

        def settled() -> bool:
            return delivery_status(hooked).pending == 0

        wait_for(settled, timeout=60, what="every delivery delivered or given up")
    finally:
        sender.stop()
        hanging.close()

    rows = {r.receiver.rsplit("/", 1)[-1]: r for r in delivery_status(hooked).receivers}
    assert (rows["down"].given_up, rows["down"].retries, rows["down"].delivered) == (5, 15, 0)
    assert (rows["hang"].given_up, rows["hang"].retries, rows["hang"].delivered) == (5, 15, 0)
    assert rows["down"].last_error and "Connection" in rows["down"].last_error
    assert (rows["dex"].delivered, rows["dex"].given_up) == (5, 0)
    assert len(receiver.requests) == 5  # once each, despite the neighbours' failures
    assert sorted(json.loads(b)["key"] for _, b in receiver.requests) == sorted(keys)
    text = render_status(delivery_status(hooked))
    assert "given up 5" in text and "delivered 5" in text and "token=abc" not in text
    # The same state is a section of `dex-celery status`, which warns about given-up deliveries.
    section = webhooks_section(hooked)
    assert section.state is State.WARN and "10 given up" in section.detail, section
    assert {r["receiver"].rsplit("/", 1)[-1] for r in section.values["receivers"]} == {
        "down",
        "hang",
        "dex",
    }
