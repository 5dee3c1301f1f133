"""A scripted Anthropic Messages API server, for the Claude Agent SDK (docs/testing.md).

The Claude Agent SDK runs the `claude` CLI, and the CLI asks the Messages API
(`POST /v1/messages`, streamed as server-sent events) at `ANTHROPIC_BASE_URL`. This server
answers there from a script, on loopback, with no network: the n-th model response of a
conversation is `turns[n]`, chosen by counting the assistant messages of the request, so a
session resumed from its saved transcript (in this process or another) follows the same
script. Every conversation request's body is kept (`requests`), so a test asserts exactly what
the model was given.

It checks who calls, as every endpoint of this project does: the `x-api-key` header must be the
server's key, and the `Host` header must name the server's own address.

    with ScriptedMessages([[tool_use("mcp__dex__refund", {...}, "toolu_1")], "Done."]) as model:
        options = ClaudeAgentOptions(env=model.env(home), ...)

The CLI also asks the model for things beside the conversation (a title, a quota probe); those
requests carry no tools and get a short text answer that does not advance the script.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

#: The key the CLI must send (`ANTHROPIC_API_KEY`).
DEFAULT_API_KEY = "dex-scripted-key"
#: How the CLI introduces a `UserPromptSubmit` hook's `additionalContext` to the model.
HOOK_CONTEXT = "UserPromptSubmit hook additional context: "
#: The model name in the answers.
MODEL = "claude-dex-scripted"


@dataclass(frozen=True, slots=True)
class ToolUse:
    """A tool call the scripted model makes (a `tool_use` content block)."""

    name: str
    input: Mapping[str, Any]
    id: str


def tool_use(name: str, arguments: Mapping[str, Any], call_id: str) -> ToolUse:
    """A tool call of the script. A dex tool offered by `dex_claude_server` is named
    `mcp__<server name>__<tool name>` for the model (`claude_agent.model_tool_name`)."""
    return ToolUse(name, dict(arguments), call_id)


#: One model response: text and tool calls, or just the final text.
Turn = Sequence[ToolUse | str] | str


@dataclass
class ScriptedMessages:
    """The scripted server: start it (`with` or `start()`), point the CLI at `url`."""

    turns: Sequence[Turn]
    api_key: str = DEFAULT_API_KEY
    #: Every conversation request's JSON body, in order.
    requests: list[dict[str, Any]] = field(default_factory=list)
    #: Requests refused (wrong key or Host), as `(path, reason)`.
    refused: list[tuple[str, str]] = field(default_factory=list)
    _server: ThreadingHTTPServer | None = None
    _thread: threading.Thread | None = None
    _lock: threading.Lock = field(default_factory=threading.Lock)

    # --- the server ------------------------------------------------------------------------

    def start(self) -> ScriptedMessages:
        server = ThreadingHTTPServer(("127.0.0.1", 0), _handler(self))
        server.daemon_threads = True
        self._server = server
        self._thread = threading.Thread(target=server.serve_forever, daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None

    def __enter__(self) -> ScriptedMessages:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    @property
    def address(self) -> str:
        assert self._server is not None, "start the server first"
        host, port = self._server.server_address[:2]
        return f"{host!s}:{port}"

    @property
    def url(self) -> str:
        return f"http://{self.address}"

    def env(self, home: str | Path) -> dict[str, str]:
        """The environment that points the CLI at this server and keeps it offline: its own
        `HOME` (its settings and transcripts), no telemetry, no update checks, no other
        traffic."""
        return {
            "ANTHROPIC_BASE_URL": self.url,
            "ANTHROPIC_API_KEY": self.api_key,
            "HOME": str(home),
            "CLAUDE_CONFIG_DIR": str(Path(home) / ".claude"),
            "DISABLE_TELEMETRY": "1",
            "DISABLE_AUTOUPDATER": "1",
            "DISABLE_ERROR_REPORTING": "1",
            "DISABLE_BUG_COMMAND": "1",
            "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
            "CLAUDE_CODE_DISABLE_TERMINAL_TITLE": "1",
            "ANTHROPIC_MODEL": MODEL,
            "ANTHROPIC_SMALL_FAST_MODEL": MODEL,
            "ANTHROPIC_DEFAULT_HAIKU_MODEL": MODEL,
        }

    # --- the script ------------------------------------------------------------------------

    def answer(self, body: Mapping[str, Any]) -> list[ToolUse | str]:
        """The content of the reply to a conversation request: `turns[n]`, `n` the assistant
        messages it holds (the last turn repeats)."""
        with self._lock:
            self.requests.append(dict(body))
        answered = sum(m.get("role") == "assistant" for m in body.get("messages", []))
        turn = self.turns[min(answered, len(self.turns) - 1)]
        return [turn] if isinstance(turn, str) else list(turn)

    # --- what the model read ---------------------------------------------------------------

    def user_texts(self, call: int = -1) -> list[str]:
        """The user texts of the `call`-th conversation request, in order: the prompts, and the
        context a `UserPromptSubmit` hook added (which the CLI sends as a message of its own
        right after the prompt, `HOOK_CONTEXT` and the text), without the CLI's own
        `<system-reminder>` notes or tool results."""
        texts = []
        for message in self.requests[call].get("messages", []):
            role, content = message.get("role"), message.get("content")
            blocks = [{"type": "text", "text": content}] if isinstance(content, str) else content
            for block in blocks or []:
                text = str(block.get("text", "")) if block.get("type") == "text" else ""
                if role == "system" and text.startswith(HOOK_CONTEXT):
                    texts.append(text[len(HOOK_CONTEXT) :])
                elif role == "user" and text and not text.startswith("<system-reminder>"):
                    texts.append(text)
        return texts

    def tool_results(self, call: int = -1) -> dict[str, str]:
        """`tool_use id -> the text the model read` of the `call`-th conversation request."""
        out: dict[str, str] = {}
        for message in self.requests[call].get("messages", []):
            content = message.get("content")
            if message.get("role") != "user" or isinstance(content, str):
                continue
            for block in content:
                if block.get("type") == "tool_result":
                    out[block["tool_use_id"]] = _result_text(block.get("content"))
        return out


def _result_text(content: Any) -> str:
    if isinstance(content, str):
        return content
    return "".join(b.get("text", "") for b in content or [] if b.get("type") == "text")


def _events(content: Sequence[ToolUse | str], message_id: str) -> list[tuple[str, dict[str, Any]]]:
    """The server-sent events of one streamed reply."""
    usage = {"input_tokens": 10, "output_tokens": 0}
    message: dict[str, Any] = {
        "id": message_id,
        "type": "message",
        "role": "assistant",
        "model": MODEL,
        "content": [],
        "stop_reason": None,
        "stop_sequence": None,
        "usage": usage,
    }
    events: list[tuple[str, dict[str, Any]]] = [
        ("message_start", {"type": "message_start", "message": message})
    ]
    for index, part in enumerate(content):
        if isinstance(part, str):
            start: dict[str, Any] = {"type": "text", "text": ""}
            delta: dict[str, Any] = {"type": "text_delta", "text": part}
        else:
            start = {"type": "tool_use", "id": part.id, "name": part.name, "input": {}}
            delta = {"type": "input_json_delta", "partial_json": json.dumps(dict(part.input))}
        events += [
            (
                "content_block_start",
                {"type": "content_block_start", "index": index, "content_block": start},
            ),
            (
                "content_block_delta",
                {"type": "content_block_delta", "index": index, "delta": delta},
            ),
            ("content_block_stop", {"type": "content_block_stop", "index": index}),
        ]
    stop = "tool_use" if any(isinstance(p, ToolUse) for p in content) else "end_turn"
    events += [
        (
            "message_delta",
            {
                "type": "message_delta",
                "delta": {"stop_reason": stop, "stop_sequence": None},
                "usage": {"output_tokens": 5},
            },
        ),
        ("message_stop", {"type": "message_stop"}),
    ]
    return events


def _handler(script: ScriptedMessages) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, format: str, *args: Any) -> None:
            return

        def _refuse(self, status: int, reason: str) -> None:
            script.refused.append((self.path, reason))
            body = json.dumps(
                {"type": "error", "error": {"type": "authentication_error", "message": reason}}
            ).encode()
            self.send_response(status)
            self.send_header("content-type", "application/json")
            self.send_header("content-length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def _checked(self) -> bool:
            if self.headers.get("host") != script.address:
                self._refuse(421, f"unexpected Host {self.headers.get('host')!r}")
                return False
            if self.headers.get("x-api-key") != script.api_key:
                self._refuse(401, "invalid x-api-key")
                return False
            return True

        def do_GET(self) -> None:
            if self._checked():
                self._refuse(404, f"no {self.path} here")

        def do_POST(self) -> None:
            length = int(self.headers.get("content-length") or 0)
            raw = self.rfile.read(length)
            if not self._checked():
                return
            if not self.path.startswith("/v1/messages") or "count_tokens" in self.path:
                self._json({"input_tokens": 10} if "count_tokens" in self.path else {})
                return
            body = json.loads(raw or b"{}")
            if body.get("tools"):
                content = script.answer(body)
                message_id = f"msg_{len(script.requests)}"
            else:  # a side request of the CLI (a title, a probe): not the conversation
                content = ["ok"]
                message_id = "msg_side"
            if body.get("stream"):
                self._stream(_events(content, message_id))
            else:
                self._json(_whole(content, message_id))

        def _json(self, value: Any) -> None:
            body = json.dumps(value).encode()
            self.send_response(200)
            self.send_header("content-type", "application/json")
            self.send_header("content-length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def _stream(self, events: list[tuple[str, dict[str, Any]]]) -> None:
            payload = "".join(f"event: {e}\ndata: {json.dumps(d)}\n\n" for e, d in events)
            body = payload.encode()
            self.send_response(200)
            self.send_header("content-type", "text/event-stream")
            self.send_header("cache-control", "no-cache")
            self.send_header("content-length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

    return Handler


def _whole(content: Sequence[ToolUse | str], message_id: str) -> dict[str, Any]:
    blocks: list[dict[str, Any]] = [
        {"type": "text", "text": p}
        if isinstance(p, str)
        else {"type": "tool_use", "id": p.id, "name": p.name, "input": dict(p.input)}
        for p in content
    ]
    stop = "tool_use" if any(isinstance(p, ToolUse) for p in content) else "end_turn"
    return {
        "id": message_id,
        "type": "message",
        "role": "assistant",
        "model": MODEL,
        "content": blocks,
        "stop_reason": stop,
        "stop_sequence": None,
        "usage": {"input_tokens": 10, "output_tokens": 5},
    }
