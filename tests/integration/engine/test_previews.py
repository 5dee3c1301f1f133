"""Previews (S13.5, docs/guardrails.md "Previews") with a real redis-server and real prefork
workers: a write that waits for approval gets its tool's preview run on a worker as a read, and
the text (secrets `***`) is on the web approval page, in `approvals list` and `calls show`, in
the approval webhook, and in LangGraph's and the OpenAI Agents SDK's approval requests. A
preview that raises or hangs reads "preview unavailable", and deciding never waits for it."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable
from typing import Any

import pytest
from click.testing import CliRunner

import devtools.toolapp as toolapp
from devtools.processes import Worker, wait_for
from devtools.toolapp import executions, make_app, previews_run
from dex_celery import CallStatus, Dex, Settings
from dex_celery.cli.main import main
from dex_celery.engine.request.previews import PENDING, PREVIEW_TASK
from dex_celery.ops.webhooks import WebhookSender
from dex_celery.web.app import WebApp
from tests.support.stores.databases import ON_BOTH_DATABASES
from tests.support.web.web_session import CREDENTIALS, signed_in
from tests.support.web.webhook_receiver import Receiver, awaiting_approval, delivered

pytestmark = pytest.mark.filterwarnings("ignore::celery.exceptions.DuplicateTaskNameWarning")

CARD = "4111-1111-1111-1111"
#: Short, so a hanging preview is given up quickly; the same in the test and its workers.
TIMEOUT = {"DEX_PREVIEW_TIMEOUT": "2s"}
SHOWN = "Refund 42.00 EUR to Ada Lovelace for order {order} (card ***)"


@pytest.fixture
def pdex(env: dict[str, str], monkeypatch: pytest.MonkeyPatch) -> Dex:
    """The test deployment with `preview_timeout` 2 s; also what `--app devtools.toolapp:dex`
    names for the CLI."""
    for name, value in {**env, **TIMEOUT}.items():
        monkeypatch.setenv(name, value)
    _app, dex = make_app(Settings.from_env({**env, **TIMEOUT}))
    dex.store.create_schema()
    monkeypatch.setattr(toolapp, "dex", dex)
    return dex


@pytest.fixture
def worker(start_worker: Callable[..., Worker]) -> Worker:
    return start_worker(extra_env=TIMEOUT)


def _refund(dex: Dex, session: str, order: str, hold: float = 0.0) -> str:
    arguments = {"order": order, "amount": "42", "card": CARD, "hold": hold}
    record = dex.client().request_call(session, "turn-1", "call-1", "previewed_refund", arguments)
    assert record.status is CallStatus.AWAITING_APPROVAL
    return record.key


def _kept(dex: Dex, key: str) -> str:
    wait_for(lambda: dex.store.get_call(key).preview is not None, timeout=20, what="the preview")
    return str(dex.store.get_call(key).preview)


@ON_BOTH_DATABASES
def test_the_preview_is_shown_on_every_approval_surface_and_runs_as_a_read(
    pdex: Dex, worker: Worker
) -> None:
    receiver = Receiver()
    try:
        sender = WebhookSender(pdex, urls=[receiver.url])
        pdex.redis.set(pdex.keys.webhook_cursor, "0")
        key = _refund(pdex, "s-page", "17", hold=1.0)

        # While the worker runs it (it takes a second), listings say so, and the webhook of the
        # waiting call is held for its text.
        (pending,) = pdex.approvals.pending()
        assert pending.preview == PENDING
        assert sender.queue_new_events() == 0

        text = _kept(pdex, key)
        assert text == SHOWN.format(order="17")

        # A read: the write itself never ran, nothing was opened or claimed for it.
        record = pdex.store.get_call(key)
        assert record.status is CallStatus.AWAITING_APPROVAL
        assert record.claimed_by is None and record.attempts == 0
        assert pdex.ledger.read(key) is None
        assert executions(key) == []
        assert [line.split()[0] for line in previews_run("17")] == ["start", "end"]

        # The web approval page and the call page.
        web = signed_in(WebApp(pdex, CREDENTIALS), "alice", "pw-a")
        page = web.get("/approvals").text
        assert text in page and CARD not in page
        assert text in web.get(f"/calls/{key}").text

        # `approvals list` (text and --json) and `calls show`.
        runner = CliRunner()
        app = ["--app", "devtools.toolapp:dex"]
        listed = runner.invoke(main, [*app, "approvals", "list"])
        assert listed.exit_code == 0, listed.output
        assert f"preview: {text}" in listed.output and CARD not in listed.output
        as_json = runner.invoke(main, [*app, "approvals", "list", "--json"])
        assert [p["preview"] for p in json.loads(as_json.output)] == [text]
        shown = runner.invoke(main, [*app, "calls", "show", key])
        assert f"preview   {text}" in shown.output

        # The approval webhook carries it.
        assert sender.queue_new_events() >= 1
        bodies = delivered(sender, receiver)
    finally:
        receiver.close()
    body = awaiting_approval(bodies)
    assert body["preview"] == text and CARD not in json.dumps(body)

    # Approving runs the write once, as without a preview.
    pdex.client().approve(key, "alice")
    (done,) = pdex.client().wait([key], timeout=20)
    assert done.status is CallStatus.SUCCEEDED
    assert [line.split()[0] for line in executions(key)] == ["start"]


def test_a_preview_never_runs_twice_at_once_and_a_repeat_runs_nothing(
    pdex: Dex, worker: Worker
) -> None:
    """A second message of the same preview (a redelivery) while the first runs finds it
    running (the lock), and one after it finds its text kept: one run, one text."""
    key = _refund(pdex, "s-twice", "18", hold=1.5)
    pdex.celery.send_task(PREVIEW_TASK, kwargs={"key": key})
    wait_for(
        lambda: f"the preview of {key} is running elsewhere" in worker.log(),
        timeout=20,
        what="the second message to find the preview running",
    )
    assert _kept(pdex, key) == SHOWN.format(order="18")
    pdex.celery.send_task(PREVIEW_TASK, kwargs={"key": key})
    wait_for(
        lambda: (
            worker.log().count(f"Task {PREVIEW_TASK}[") >= 3
            and worker.log().count("succeeded") >= 3
        ),
        timeout=20,
        what="three preview messages handled",
    )
    assert [line.split()[0] for line in previews_run("18")] == ["start", "end"]


def test_a_preview_that_raises_or_hangs_is_unavailable_and_deciding_never_waits(
    pdex: Dex, worker: Worker
) -> None:
    client = pdex.client()
    raises = client.request_call("s-fail", "turn-1", "call-1", "preview_raises", {"order": "5"})
    hangs = client.request_call("s-fail", "turn-1", "call-2", "preview_hangs", {"order": "6"})
    early = client.request_call("s-fail", "turn-1", "call-3", "preview_hangs", {"order": "7"})

    # Approving while its preview still runs (it hangs) is not held up by it.
    wait_for(lambda: previews_run("7"), timeout=20, what="the hanging preview to start")
    started = time.monotonic()
    client.approve(early.key, "alice")
    assert time.monotonic() - started < 1.0
    (ran,) = client.wait([early.key], timeout=20)
    assert ran.status is CallStatus.SUCCEEDED

    assert _kept(pdex, raises.key) == (
        "preview unavailable: it raised LookupError: order 5 is not in the shop's database"
    )
    assert _kept(pdex, hangs.key) == (
        "preview unavailable: it did not finish within 2s (preview_timeout)"
    )
    listed = {p.key: p.preview for p in pdex.approvals.pending("s-fail")}
    assert listed[hangs.key].startswith("preview unavailable")

    client.approve(raises.key, "alice")
    client.reject(hangs.key, "alice", reason="no preview, no refund")
    done = {r.key: r.status for r in client.wait([raises.key, hangs.key], timeout=20)}
    assert done == {raises.key: CallStatus.SUCCEEDED, hangs.key: CallStatus.REJECTED}


def test_without_a_worker_the_preview_reads_unavailable_after_its_time(pdex: Dex) -> None:
    key = _refund(pdex, "s-none", "19")
    assert pdex.approvals.pending()[0].preview == PENDING
    wait_for(
        lambda: pdex.approvals.pending()[0].preview != PENDING, timeout=10, what="the deadline"
    )
    assert pdex.approvals.pending()[0].preview == (
        "preview unavailable: no worker ran it within 4s (2 x preview_timeout)"
    )
    assert pdex.client().approve(key, "alice").status is CallStatus.PENDING


def test_langgraph_interrupt_carries_the_preview(pdex: Dex, worker: Worker) -> None:
    from langchain.agents import create_agent
    from langchain_core.messages import AIMessage, HumanMessage
    from langgraph.checkpoint.memory import InMemorySaver
    from langgraph.types import Command

    from dex_celery.integrations.frameworks.langgraph import dex_tools
    from dex_celery.testing.models.langchain import ScriptedChatModel

    arguments = {"order": "20", "amount": "42", "card": CARD}
    call = AIMessage("", tool_calls=[{"name": "previewed_refund", "args": arguments, "id": "c1"}])
    model = ScriptedChatModel(turns=[call, AIMessage("Refunded.")])
    agent = create_agent(model, dex_tools(pdex, ["previewed_refund"]), checkpointer=InMemorySaver())
    config: Any = {"configurable": {"thread_id": "lg-preview"}}
    state = agent.invoke({"messages": [HumanMessage("Refund order 20")]}, config)
    (asked,) = state["__interrupt__"]
    assert asked.value["preview"] == SHOWN.format(order="20")
    assert asked.value["arguments"]["card"] == "***"

    state = agent.invoke(Command(resume={"approved": True, "decided_by": "alice"}), config)
    record = pdex.store.get_call("lg-preview/turn-1/c1")
    assert record.status is CallStatus.SUCCEEDED and record.approval.decided_by == "alice"


def test_openai_agents_approval_request_carries_the_preview(pdex: Dex, worker: Worker) -> None:
    from agents import Agent, Runner, set_trace_processors

    from dex_celery.integrations.frameworks.openai_agents import DexSession
    from dex_celery.testing.models.openai_agents import ScriptedModel, function_call

    set_trace_processors([])
    arguments = {"order": "21", "amount": "42", "card": CARD}
    model = ScriptedModel([[function_call("previewed_refund", arguments, call_id="c1")]])
    session = DexSession(pdex, "sdk-preview")
    agent = Agent(name="desk", model=model, tools=session.function_tools(["previewed_refund"]))

    async def run() -> dict[str, Any] | None:
        result = await Runner.run(agent, "Refund order 21", session=session)
        (item,) = result.interruptions
        return await session.approval_request(item)

    asked = asyncio.run(run())
    assert asked is not None
    assert asked["dex_key"] == "sdk-preview/turn-1/c1"
    assert asked["preview"] == SHOWN.format(order="21")
    assert asked["arguments"]["card"] == "***"
