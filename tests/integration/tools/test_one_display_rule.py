"""One call, every output, one redaction (issue 18: "one function that decides what a record's
arguments look like to a person"; dex_celery/tools/redact.py `shown_arguments`).

A write that waits for approval carries a secret dict argument (`card`, named by the policy)
and a key named `secret` inside a non-secret argument (`note`, hidden by name in every output).
It is requested through a real `dex-celery mcp` server (the SDK's client over stdio), then shown
by the CLI (`calls show`, `calls show --json`, `approvals list`, `approvals list --json`), the
web app's call and approvals pages, and a webhook body posted to a local receiver. Each output's
arguments are parsed back and must be the same value, with no secret in any of them.
"""

from __future__ import annotations

import html
import json
import re
import sys
from pathlib import Path
from typing import Any

import anyio
from click.testing import CliRunner
from mcp import Client, StdioServerParameters

import devtools.toolapp as toolapp
from devtools.processes import ROOT
from dex_celery import CallStatus, Dex
from dex_celery.cli.main import main
from dex_celery.integrations.mcp.wire import IDEMPOTENCY_META_KEY
from dex_celery.web.app import WebApp
from tests.support.web.web_session import CREDENTIALS as WEB_USERS
from tests.support.web.web_session import signed_in
from tests.support.web.webhook_receiver import approval_webhook

CARD_NUMBER = "4111-2222-3333-4444"
CVC = "8642"
HIDDEN_NOTE = "hunter2-in-a-note"
ARGUMENTS = {
    "order": 7,
    "card": {"number": CARD_NUMBER, "cvc": CVC},
    "note": {"secret": HIDDEN_NOTE, "text": "deliver by noon"},
}
#: What every output shows of them.
SHOWN = {"order": 7, "card": "***", "note": {"secret": "***", "text": "deliver by noon"}}
SECRETS = (CARD_NUMBER, CVC, HIDDEN_NOTE)
KEY = "s-display/t1/c1"


def _json_after(text: str, marker: str) -> Any:
    """The JSON value that follows `marker` in `text`."""
    start = text.index(marker) + len(marker)
    value, _ = json.JSONDecoder().raw_decode(text, start)
    return value


def _request_through_mcp(env: dict[str, str]) -> str:
    params = StdioServerParameters(
        command=str(Path(sys.executable).with_name("dex-celery")),
        args=["--app", "devtools.toolapp:dex", "mcp", "--wait-timeout", "5"],
        env={**env, "PYTHONPATH": str(ROOT)},
        cwd=str(ROOT),
    )

    async def call() -> str:
        async with Client(params) as mcp:
            answer = await mcp.call_tool(
                "guarded_profile", ARGUMENTS, meta={IDEMPOTENCY_META_KEY: KEY}
            )
        return "\n".join(block.text for block in answer.content)

    return anyio.run(call)


def test_every_output_shows_a_calls_arguments_the_same_way(
    dex: Dex, env: dict[str, str], monkeypatch: Any
) -> None:
    shown: dict[str, Any] = {}
    texts: dict[str, str] = {}

    answer = _request_through_mcp(env)
    texts["mcp answer"] = answer
    shown["mcp answer"] = _json_after(answer, " with arguments ")
    record = dex.client().get_call(KEY)
    assert record.status is CallStatus.AWAITING_APPROVAL

    monkeypatch.setattr(toolapp, "dex", dex)
    runner = CliRunner()

    def cli(*args: str) -> str:
        result = runner.invoke(main, ["--app", "devtools.toolapp:dex", *args])
        assert result.exit_code == 0, result.output
        texts[" ".join(args)] = result.output
        return result.output

    shown["calls show"] = _json_after(cli("calls", "show", KEY), "arguments ")
    shown["calls show --json"] = json.loads(cli("calls", "show", KEY, "--json"))["arguments"]
    (pending,) = json.loads(cli("approvals", "list", "--json"))
    shown["approvals list --json"] = pending["arguments"]
    listed = cli("approvals", "list")
    shown["approvals list"] = _json_after(listed, listed.split("{", 1)[0])
    shown["client pending_approvals"] = dex.client().pending_approvals()[0].arguments

    web = signed_in(WebApp(dex, WEB_USERS), "alice", "pw-a")
    page = web.get(f"/calls/{KEY}").text
    texts["web call page"] = page
    pre = re.search(r'<pre id="arguments">(.*?)</pre>', page, re.S)
    assert pre is not None
    shown["web call page"] = json.loads(html.unescape(pre.group(1)))
    approvals = web.get("/approvals").text
    texts["web approvals page"] = approvals
    row = re.search(r"<td><pre>(.*?)</pre></td>", approvals, re.S)
    assert row is not None
    shown["web approvals page"] = json.loads(html.unescape(row.group(1)))

    body = approval_webhook(dex)
    texts["webhook body"] = json.dumps(body)
    shown["webhook body"] = body["arguments"]

    assert shown == {where: SHOWN for where in shown}, shown
    for where, text in texts.items():
        for secret in SECRETS:
            assert secret not in text, f"a secret value in {where}"
