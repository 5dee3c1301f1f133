"""dex tools as OpenAI Agents SDK function tools: an `Agent`'s tool calls run on Celery workers.

    from dex_celery.integrations.frameworks.openai_agents import dex_function_tools

    agent = Agent(name="desk", tools=dex_function_tools(dex, ["lookup_order", "cancel_order"]))

Each tool call the model makes is requested through the ledger (S2, S3) and waited for; the
model then reads exactly the text of the call's record, the same text the session history keeps
(S4.4): the result, `Error: ...` (with the did-not-run sentence where it applies, S4.2), the
rejection, or `OUTCOME_UNKNOWN_TOOL_RESULT` (S4.5). A failed or unknown call is text for the
model, never an exception that ends the run.

The idempotency key is built from the SDK's own ids (S2.1):

- session id: the run's id, which is the SDK's trace id (one per `Runner.run`, kept when a run
  resumes from a `RunState`; pin it with `RunConfig(trace_id=...)`), unless `session_id` is
  given (a string, or a function of the run context, e.g. your conversation id); with tracing
  disabled, an id made for the run (`run_<hex>`, not kept across a serialized `RunState`);
- turn id: `turn-<n>`, the run's model-response count so far, including the response that made
  the call (the SDK keeps it in the run's usage and restores it with a `RunState`), so the first
  model response is `turn-1` (the rule of every adapter, `calls.turn_id`);
- tool-call id: the model's `call_id`, which the SDK requires to be unique within a run.

Approvals use the SDK's human-in-the-loop mechanism: every dex tool's `needs_approval` requests
the call in dex when the model makes it and answers what the record says, so a call waits for a
person in the SDK exactly when dex recorded it waiting (its policy, S1.3, the session's default,
a changed MCP tool definition, S1.7, or the repeat guard, S5.4); the record waits, with its
approval deadline, also in `dex-celery approvals`, and the run stops with an interruption. Approving it there (`state.approve(item)`, then
`Runner.run(agent, state)`) records the decision in dex, by `approver`, and the call runs under
its recorded policy (S6.2). Rejecting it there never runs it, and the record ends `rejected`:
at once, by `approver`, when the run's `RunConfig(tool_error_formatter=dex_rejections(...))`
is set (the model then reads the record's rejection text), otherwise at its approval deadline
(decided by the system). A call found waiting for a person in dex anyway (decided elsewhere,
e.g. `dex-celery approvals`) answers with that pending state and its key.
`approval_request(dex, item, session_id=...)` (or `DexSession.approval_request(item)`) gives
what to show the person for an interruption, with the tool's preview text (S13.5).

One conversation (S12.1): `DexSession` wraps the SDK `Session` that stores a conversation; it
copies the user and assistant messages the SDK saves into the dex session, and adds the
session's user messages written through dex that the stored items do not hold yet (the
reconciler's reports) when the SDK loads the history for a run.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Sequence
from typing import Any, Unpack

from agents import FunctionTool, RunContextWrapper, SQLiteSession
from agents.items import ToolApprovalItem, TResponseInputItem
from agents.memory.session import Session, SessionABC
from agents.run_config import ToolErrorFormatterArgs
from agents.tool_context import ToolContext as AgentsToolContext
from agents.tracing import get_current_trace

from dex_celery.client.dex_client import AsyncDexClient, DexClient
from dex_celery.engine import RuntimeSource
from dex_celery.errors import ConfigurationError, DexError
from dex_celery.integrations.conversation import Conversation
from dex_celery.integrations.frameworks.calls import (
    AdapterOptions,
    Decision,
    FrameworkBridge,
    FrameworkCall,
    pending_request,
    record_text,
    runtime_source,
    select_tools,
    turn_id,
)
from dex_celery.model.conversation import SeenMessage
from dex_celery.model.outcomes import CallStatus
from dex_celery.model.records import MessageRole, ToolCallRecord
from dex_celery.tools.signature_schema import arguments_schema
from dex_celery.tools.tool import Tool

#: Who approved, in dex's record, a call a person approved in the SDK (unless `approver` is set).
DEFAULT_APPROVER = "openai-agents-sdk"
#: The trace id of a run whose tracing is disabled: it names no run.
_NO_TRACE = "no-op"
#: Where a run without a trace keeps the id made for it (see `_Bridge._untraced_run_id`).
_RUN_ID_ATTRIBUTE = "_dex_celery_run_id"

SessionIdSource = str | Callable[[RunContextWrapper[Any]], str]


def dex_function_tools(
    dex: RuntimeSource | DexClient | AsyncDexClient,
    names: Sequence[str] | None = None,
    *,
    session_id: SessionIdSource | None = None,
    **options: Unpack[AdapterOptions],
) -> list[FunctionTool]:
    """The SDK function tools of the named dex tools (all registered tools by default).

    `dex` may also be a `DexClient` or `AsyncDexClient` of the deployment. A call still
    running after a few seconds reports its progress (`CallProgress`) to `progress` and to the
    log. With a `DexSession`, use `session.function_tools(...)`, which names its session.
    """
    source = runtime_source(dex)
    tools = select_tools(source, names)
    bridge = _Bridge(source, session_id, options)
    return [bridge.function_tool(tool) for tool in tools]


class _Bridge(FrameworkBridge[RunContextWrapper[Any]]):
    framework = "OpenAI Agents SDK"
    default_approver = DEFAULT_APPROVER

    def function_tool(self, tool: Tool) -> FunctionTool:
        async def invoke(ctx: AgentsToolContext[Any], arguments: str) -> str:
            return await self.invoke(tool, ctx, arguments)

        async def needs_approval(
            ctx: RunContextWrapper[Any], arguments: dict[str, Any], call_id: str
        ) -> bool:
            """Whether the call waits for a person, as its dex record says. The call is
            requested here, so it is recorded while a person decides (a rejected call never
            lacks a record), and the record's status answers: every gate the request applies
            counts (the policy, the session's default, a changed MCP tool definition, the
            repeat guard), not a second guess at them."""
            record = await self.arequest(self.framework_call(ctx, tool, call_id, arguments))
            if isinstance(record, str) or record.status is not CallStatus.AWAITING_APPROVAL:
                return False  # invoked next: the same request says why, and the model reads it
            # The run stops with its interruption once the preview is kept (or cannot come),
            # so `approval_request(item)` shows it to the person asked (S13.5).
            await self.decisions.apreview(record)
            return True

        return FunctionTool(
            name=tool.name,
            description=tool.description or tool.name,
            params_json_schema=arguments_schema(tool),
            on_invoke_tool=invoke,
            # Schemas come from tools and MCP servers as they are, not in the SDK's strict form.
            strict_json_schema=False,
            needs_approval=needs_approval,
        )

    # --- ids -----------------------------------------------------------------------------------

    def run_id(self, ctx: RunContextWrapper[Any]) -> str:
        return self.session(ctx, lambda: self._trace_id(ctx))

    def _trace_id(self, ctx: RunContextWrapper[Any]) -> str:
        trace = get_current_trace()
        if trace is not None and trace.trace_id != _NO_TRACE:
            return trace.trace_id
        return self._untraced_run_id(ctx)

    @staticmethod
    def _untraced_run_id(ctx: RunContextWrapper[Any]) -> str:
        """Tracing is off, so the run has no id of its own: make one and keep it on the run's
        usage object, which the SDK shares between the run and every tool context of it."""
        run_id = getattr(ctx.usage, _RUN_ID_ATTRIBUTE, None)
        if isinstance(run_id, str):
            return run_id
        run_id = f"run_{uuid.uuid4().hex}"
        try:
            setattr(ctx.usage, _RUN_ID_ATTRIBUTE, run_id)
        except (AttributeError, TypeError) as e:
            raise ConfigurationError(
                "the run has no trace id to use as its session id (tracing is disabled); pass "
                "dex_function_tools(..., session_id=...) or enable tracing"
            ) from e
        return run_id

    @staticmethod
    def turn_of(ctx: RunContextWrapper[Any]) -> str:
        return turn_id(ctx.usage.requests)

    # --- the call ------------------------------------------------------------------------------

    def framework_call(
        self, ctx: RunContextWrapper[Any], tool: Tool, call_id: str, arguments: Any
    ) -> FrameworkCall:
        """The call of this run: the `DexSession` copies the messages that led to it as the SDK
        saves them, before its secrets are known, so the request only scrubs those copies."""
        return FrameworkCall(
            self.run_id(ctx), self.turn_of(ctx), call_id, tool, arguments, history=None
        )

    async def invoke(self, tool: Tool, ctx: AgentsToolContext[Any], arguments: str) -> str:
        call = self.framework_call(ctx, tool, ctx.tool_call_id, arguments or "{}")

        async def ask(record: ToolCallRecord) -> Decision | None:
            """The SDK invokes a call whose needs_approval said so only after a person approved
            it; a call found waiting that nobody approved in the run keeps waiting."""
            if ctx.is_tool_approved(tool.name, ctx.tool_call_id):
                return Decision(True, None, None)
            return None

        return await self.acall(call, ask)


async def approval_request(
    dex: RuntimeSource | DexClient | AsyncDexClient, item: ToolApprovalItem, *, session_id: str
) -> dict[str, Any] | None:
    """What to show the person asked to approve an interruption of a run (a `ToolApprovalItem`
    of `result.interruptions`) whose call waits in dex: `{"dex_key", "tool", "arguments",
    "approval_deadline", "preview"}`, secret arguments `***`, `preview` the tool's preview
    text (S13.5) or None. None when no call of the session with that call id waits any more.
    `session_id`: the dex session of the run (`DexSession.session_id`)."""
    raw = item.raw_item
    call_id = raw.get("call_id") if isinstance(raw, dict) else getattr(raw, "call_id", None)
    for pending in await AsyncDexClient(runtime_source(dex)).pending_approvals(session_id):
        if pending.tool_call_id == call_id:
            return pending_request(pending)
    return None


def dex_rejections(
    dex: RuntimeSource | DexClient | AsyncDexClient,
    *,
    session_id: SessionIdSource | None = None,
    approver: str = DEFAULT_APPROVER,
) -> Callable[[ToolErrorFormatterArgs[Any]], Any]:
    """A `RunConfig(tool_error_formatter=...)` that records the SDK's rejections in dex.

    A call rejected with `state.reject(item)` ends `rejected` in dex at once, by `approver`, and
    the model reads the record's rejection text. Other tool errors keep the SDK's own message.
    (A rejection with an explicit `rejection_message` bypasses formatters in the SDK: that call's
    record ends `rejected` at its approval deadline.) Pass the same `session_id` as to
    `dex_function_tools`.
    """
    source = runtime_source(dex)
    bridge = _Bridge(source, session_id, {"approver": approver, "wait_timeout": 0.0})
    rejected = Decision(False, None, "rejected in the OpenAI Agents SDK")

    async def formatter(args: ToolErrorFormatterArgs[Any]) -> str | None:
        if args.kind != "approval_rejected" or args.tool_name not in source.runtime.tools:
            return None
        ctx = args.run_context
        key = f"{bridge.run_id(ctx)}/{bridge.turn_of(ctx)}/{args.call_id}"
        try:
            record = await bridge.decisions.aclient.get_call(key)
            record = await bridge.arecord_decision(record, rejected)
        except DexError:
            return None
        return record_text(record) if record.finished else None

    return formatter


class DexSession(SessionABC):
    """An SDK `Session` that is also the dex session: one conversation (S12.1).

    The Agents SDK keeps a conversation in a `Session` (`Runner.run(agent, input,
    session=...)`), so that is where dex meets it. `DexSession` wraps the session that stores
    the items (`inner`; an in-memory `SQLiteSession` by default, or your own) and adds two
    things, both decided from the stored items themselves:

    - when the SDK saves items (`add_items`), the user and assistant messages are copied into
      the dex session, so the approvals page, `calls show` and the webhook show what led to a
      call;
    - when the SDK loads the history for a run (`get_items`), the session's user messages
      written through dex that the stored items do not hold yet (reconciliation reports first)
      are added to the stored items, so the model reads them at this run and the history keeps
      them: a later run is not handed them again.

        session = DexSession(dex, "conv-42", SQLiteSession("conv-42", "chats.db"))
        agent = Agent(name="desk", tools=session.function_tools(["refund"]))
        await Runner.run(agent, "Where is my refund?", session=session)
    """

    def __init__(
        self,
        dex: RuntimeSource | DexClient | AsyncDexClient,
        session_id: str,
        inner: Session | None = None,
    ) -> None:
        self.source = runtime_source(dex)
        self.session_id = session_id
        self.inner: Session = inner if inner is not None else SQLiteSession(session_id)
        self.session_settings = self.inner.session_settings
        self._conversation = Conversation(self.source)

    def function_tools(
        self, names: Sequence[str] | None = None, **options: Any
    ) -> list[FunctionTool]:
        """`dex_function_tools` whose calls belong to this session."""
        return dex_function_tools(self.source, names, session_id=self.session_id, **options)

    async def approval_request(self, item: ToolApprovalItem) -> dict[str, Any] | None:
        """`approval_request` of an interruption of a run in this session (with its preview)."""
        return await approval_request(self.source, item, session_id=self.session_id)

    async def get_items(self, limit: int | None = None) -> list[TResponseInputItem]:
        items = await self.inner.get_items()
        texts = [m.text for m in seen_items(items) if m.role is MessageRole.USER]
        pending = await self._conversation.aundelivered(self.session_id, texts)
        if pending:
            handed: list[TResponseInputItem] = [
                {"role": "user", "content": m.text or ""} for m in pending
            ]
            await self.inner.add_items(handed)
            items = [*items, *handed]
        return items if limit is None else items[-limit:] if limit > 0 else []

    async def add_items(self, items: list[TResponseInputItem]) -> None:
        await self.inner.add_items(items)
        await self._conversation.arecord(self.session_id, seen_items(await self.inner.get_items()))

    async def pop_item(self) -> TResponseInputItem | None:
        return await self.inner.pop_item()

    async def clear_session(self) -> None:
        await self.inner.clear_session()


def seen_items(items: Sequence[Any]) -> list[SeenMessage]:
    """The user messages and the assistant's text of SDK input items, in order."""
    seen = []
    for item in items:
        if not isinstance(item, dict) or item.get("role") not in ("user", "assistant"):
            continue
        if item.get("type", "message") != "message":
            continue
        text = _item_text(item.get("content"))
        if text:
            role = MessageRole.USER if item["role"] == "user" else MessageRole.ASSISTANT
            seen.append(SeenMessage(role, text))
    return seen


def _item_text(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(
            str(part.get("text", ""))
            for part in content
            if isinstance(part, dict) and part.get("type") in ("input_text", "output_text")
        )
    return ""
