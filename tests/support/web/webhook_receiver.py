"""A local webhook receiver for the tests that check what a deployment sends, and the one way
they deliver to it and read the approval webhook."""

from __future__ import annotations

import http.server
import json
import threading
from typing import Any

from devtools.processes import free_port, wait_for
from dex_celery import Dex
from dex_celery.ops.webhooks import WebhookSender


class Receiver:
    """A local HTTP receiver that records every POST (headers and body) and answers 204."""

    def __init__(self) -> None:
        self.requests: list[tuple[dict[str, str], bytes]] = []
        received = self.requests

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
                received.append(({k: v for k, v in self.headers.items()}, body))
                self.send_response(204)
                self.end_headers()

            def log_message(self, *args: Any) -> None:
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", free_port()), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/hooks/dex?token=abc"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def delivered(sender: WebhookSender, receiver: Receiver) -> list[dict[str, Any]]:
    """Deliver what the sender has queued, wait until the receiver has it; the JSON bodies."""
    sender.deliver_due(wait=True)
    wait_for(lambda: receiver.requests, timeout=10, what="the webhook")
    return [json.loads(body) for _, body in receiver.requests]


def awaiting_approval(bodies: list[dict[str, Any]]) -> dict[str, Any]:
    """The one `tool_call_awaiting_approval` body among those delivered."""
    (body,) = [b for b in bodies if b["event"] == "tool_call_awaiting_approval"]
    return body


def approval_webhook(dex: Dex) -> dict[str, Any]:
    """Send every event recorded so far to a fresh receiver (a first sender starts at "now": not
    here) and return the body of the one approval webhook."""
    receiver = Receiver()
    try:
        sender = WebhookSender(dex, urls=[receiver.url])
        dex.redis.set(dex.keys.webhook_cursor, "0")
        sender.queue_new_events()
        bodies = delivered(sender, receiver)
    finally:
        receiver.close()
    return awaiting_approval(bodies)
