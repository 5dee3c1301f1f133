"""A local webhook receiver for the tests that check what a deployment sends."""

from __future__ import annotations

import http.server
import threading
from typing import Any

from devtools.processes import free_port


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
