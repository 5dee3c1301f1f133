"""dex tools as LangChain tools for LangGraph graphs: each tool call runs on a Celery worker.

    from dex_celery.integrations.frameworks.langgraph import dex_tools

    agent = create_agent(model, dex_tools(dex, ["lookup", "cancel"]), checkpointer=saver)

`dex_tools` returns LangChain `BaseTool`s (`StructuredTool`s) for `create_agent` or a `ToolNode`
of your own graph; both sync (`invoke`) and async (`ainvoke`) graphs work. Each call the model
makes is requested through the ledger (S2, S3) and waited for; the model reads exactly the
record's TOOL message (S4.4) as the `ToolMessage`: the result, `Error: ...`, the rejection, or
`OUTCOME_UNKNOWN_TOOL_RESULT` (S4.5). A failed or unknown call is text, never an exception.

The idempotency key (S2.1):

- session id: the graph's `thread_id` (`config["configurable"]["thread_id"]`), unless `session_id`
  is given (a string, or a function of the tool's `ToolRuntime`);
- turn id: `turn-<n>`, the count of AI messages in the graph's `messages` state up to and
  including the one that made the call (`calls.turn_id`): the state is what the
  checkpointer keeps, so the count survives a crash;
- tool-call id: the model's tool call `id`.

LangGraph runs a node again from its start when a graph resumes (after `interrupt()`, or from
its checkpoint after a crash). A dex tool asked again asks dex for the same key and gets the
same record (S2.3): a write that ran or is running is waited for, never run a second time.

Approvals use LangGraph's `interrupt()`: a call whose dex policy asks a person (S1.3) is
requested in dex first (its record waits, with its deadline), then the graph stops with an
interrupt whose value is `{"dex_key", "tool", "arguments", "approval_deadline"}`, with
`"preview"` for a tool that declares a preview function (S13.5). Resume with
`Command(resume=...)`, the decision being one of:

- `True` / `False`;
- `{"approved": bool, "decided_by": "alice", "reason": "..."}`;
- LangChain's human-in-the-loop shape `{"type": "approve" | "reject", "message": "..."}`, with
  `"decided_by"` beside it.

Approving records who decided (`decided_by`, else `approver`) and runs the call; rejecting
records it `rejected` with who decided and the reason, and the model reads the record's
rejection text. An edit (`{"type": "edit", ...}`, or any `args` in the decision) is refused, as
Pydantic AI's `override_args` is: the call is recorded `rejected` and the model may ask again.

One conversation (S12.1): at each call the state's human and AI messages are copied into the dex
session (scrubbed of the call's secrets); the `DexConversation` middleware of `create_agent`
also copies them before each model call and adds the session's user messages written through
dex that the state does not hold yet (the reconciler's reports) as `HumanMessage`s, which the
checkpointer keeps (`dex_messages` does the same for a graph of your own). A call still running
after a few seconds reports its progress as a custom stream event.
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Unpack

from langchain.agents.middleware import AgentMiddleware
from langchain_core.messages import AIMessage, HumanMessage
from langchain_core.tools import BaseTool, StructuredTool
from langgraph.config import get_config, get_stream_writer
from langgraph.prebuilt import ToolRuntime
from langgraph.runtime import Runtime
from langgraph.types import interrupt

from dex_celery.client.dex_client import AsyncDexClient, DexClient
from dex_celery.engine import RuntimeSource
from dex_celery.errors import ConfigurationError
from dex_celery.integrations.conversation import Conversation
from dex_celery.integrations.frameworks.calls import (
    AdapterOptions,
    CallProgress,
    Decision,
    FrameworkBridge,
    FrameworkCall,
    resolve_session,
    responses_through,
    runtime_source,
    select_tools,
    turn_id,
)
from dex_celery.model.conversation import SeenMessage
from dex_celery.model.records import MessageRole, ToolCallRecord
from dex_celery.tools.signature_schema import arguments_schema
from dex_celery.tools.tool import Tool

#: Who decided, in dex's record, when the resume value does not say.
DEFAULT_APPROVER = "langgraph"
#: The id prefix of a `HumanMessage` that carries a dex message (`dex-message-<id>`).
DEX_MESSAGE_ID_PREFIX = "dex-message-"
#: The key of the custom stream events (`stream_mode="custom"`) a waiting call reports.
PROGRESS_EVENT = "dex_progress"

SessionIdSource = str | Callable[[ToolRuntime], str]


def dex_tools(
    dex: RuntimeSource | DexClient | AsyncDexClient,
    names: Sequence[str] | None = None,
    *,
    session_id: SessionIdSource | None = None,
    **options: Unpack[AdapterOptions],
) -> list[BaseTool]:
    """LangChain tools of the named dex tools (all registered tools by default).

    A call still running after a few seconds reports its progress (`CallProgress`) to
    `progress`, else as a custom stream event `{"dex_progress": {...}}` of the graph
    (`stream_mode="custom"`)."""
    source = runtime_source(dex)
    bridge = _Bridge(
        source, session_id, {**options, "progress": options.get("progress") or _stream_progress}
    )
    return [bridge.tool(tool) for tool in select_tools(source, names)]


class _Bridge(FrameworkBridge[ToolRuntime]):
    framework = "LangGraph"
    default_approver = DEFAULT_APPROVER

    def tool(self, tool: Tool) -> BaseTool:
        # `runtime: ToolRuntime` is how a ToolNode (and create_agent) hands a tool the graph's
        # state, config and the tool call id; the model is shown only the tool's own schema.
        def run(runtime: ToolRuntime, **arguments: Any) -> str:
            return self.run(tool, runtime, arguments)

        async def arun(runtime: ToolRuntime, **arguments: Any) -> str:
            return await self.arun(tool, runtime, arguments)

        return StructuredTool(
            name=tool.name,
            description=tool.description or tool.name,
            args_schema=arguments_schema(tool),
            func=run,
            coroutine=arun,
        )

    # --- the call ------------------------------------------------------------------------------

    def framework_call(
        self, tool: Tool, runtime: ToolRuntime, arguments: dict[str, Any]
    ) -> FrameworkCall:
        """The call this runtime belongs to: the session, its turn in the graph's messages
        state, the tool call id, and the messages that led to it."""
        if not isinstance(runtime, ToolRuntime) or not runtime.tool_call_id:
            raise ConfigurationError(
                "dex tools run inside a LangGraph ToolNode (or create_agent), which hands them "
                "the tool call id and the graph's state"
            )
        session = self.session(runtime, lambda: _thread_id(runtime.config, "dex_tools"))
        messages, call_id = _messages(runtime.state), runtime.tool_call_id
        turn = turn_id(
            responses_through(
                messages,
                lambda m: isinstance(m, AIMessage),
                lambda m: any(call.get("id") == call_id for call in m.tool_calls),
            )
        )
        return FrameworkCall(session, turn, call_id, tool, arguments, seen_messages(messages))

    def run(self, tool: Tool, runtime: ToolRuntime, arguments: dict[str, Any]) -> str:
        call = self.framework_call(tool, runtime, arguments)
        # The graph stops here for a person's decision; it is resumed with it (the preview
        # shown with the request).
        return self.call(call, lambda record: Decision.parse(interrupt(self.shown(call, record))))

    async def arun(self, tool: Tool, runtime: ToolRuntime, arguments: dict[str, Any]) -> str:
        call = self.framework_call(tool, runtime, arguments)

        async def ask(record: ToolCallRecord) -> Decision:
            return Decision.parse(interrupt(await self.ashown(call, record)))

        return await self.acall(call, ask)


# --- one conversation (S12.1) -------------------------------------------------------------------


def seen_messages(messages: Sequence[Any]) -> list[SeenMessage]:
    """The human messages and the AI's text of a LangGraph `messages` state, in order."""
    seen = []
    for message in messages:
        if isinstance(message, HumanMessage):
            role = MessageRole.USER
        elif isinstance(message, AIMessage):
            role = MessageRole.ASSISTANT
        else:
            continue
        text = message.text if isinstance(message.text, str) else str(message.text)
        if text:
            seen.append(SeenMessage(role, text))
    return seen


def dex_messages(
    dex: RuntimeSource | DexClient | AsyncDexClient, session_id: str, messages: Sequence[Any]
) -> list[HumanMessage]:
    """The session's user messages written through dex (reconciliation reports first) that the
    graph's `messages` do not hold yet, as `HumanMessage`s to add to the state: for a graph of
    your own, call it in the node before the model. `DexConversation` does it for
    `create_agent`."""
    texts = [m.text for m in seen_messages(messages) if m.role is MessageRole.USER]
    pending = Conversation(runtime_source(dex)).undelivered(session_id, texts)
    return [
        HumanMessage(content=m.text or "", id=f"{DEX_MESSAGE_ID_PREFIX}{m.id}") for m in pending
    ]


class DexConversation(AgentMiddleware):
    """`create_agent` middleware: before each model call, the state's messages are copied into
    the session, and the session's user messages written
    through dex that the state does not hold yet become `HumanMessage`s of the state, so the
    model reads them now and the checkpoint keeps them (a resumed thread is not handed them
    again). The session is the graph's `thread_id`, unless `session_id` is given, as for
    `dex_tools`.

        agent = create_agent(model, dex_tools(dex), middleware=[DexConversation(dex)],
                             checkpointer=saver)
    """

    def __init__(
        self,
        dex: RuntimeSource | DexClient | AsyncDexClient,
        *,
        session_id: str | Callable[[Mapping[str, Any]], str] | None = None,
    ) -> None:
        super().__init__()
        self.source = runtime_source(dex)
        self.session_id = session_id

    def _session(self) -> str:
        config = get_config()
        return resolve_session(
            self.session_id, config, lambda: _thread_id(config, "DexConversation")
        )

    def before_model(self, state: Any, runtime: Runtime[Any]) -> dict[str, Any] | None:
        session, messages = self._session(), _messages(state)
        Conversation(self.source).record(session, seen_messages(messages))
        pending = dex_messages(self.source, session, messages)
        return {"messages": pending} if pending else None

    async def abefore_model(self, state: Any, runtime: Runtime[Any]) -> dict[str, Any] | None:
        return await asyncio.to_thread(self.before_model, state, runtime)


def _stream_progress(progress: CallProgress) -> None:
    """A waiting call's progress as a custom stream event of the graph run."""
    try:
        writer = get_stream_writer()
    except RuntimeError:  # not inside a graph run: the log line is all there is
        return
    writer({PROGRESS_EVENT: {**dataclasses.asdict(progress), "status": progress.status.value}})


def _messages(state: Any) -> Sequence[Any]:
    if isinstance(state, Mapping):
        return list(state.get("messages") or [])
    if isinstance(state, list):
        return state
    return list(getattr(state, "messages", None) or [])


def _thread_id(config: Mapping[str, Any] | None, asked_by: str) -> str:
    """The graph's `thread_id`: the session id when `session_id` is not given."""
    thread = ((config or {}).get("configurable") or {}).get("thread_id")
    if not isinstance(thread, str) or not thread:
        raise ConfigurationError(
            "the graph has no thread_id to use as the session id; run it with "
            f"config={{'configurable': {{'thread_id': ...}}}} or pass {asked_by}(..., "
            "session_id=...)"
        )
    return thread
