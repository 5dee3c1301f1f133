"""dex tools as Google ADK tools: an ADK agent's tool calls run on Celery workers.

    from dex_celery.integrations.frameworks.google_adk import DexConversation, dex_adk_tools

    agent = LlmAgent(name="desk", model=model, tools=dex_adk_tools(dex, ["lookup", "refund"]))
    app = App(name="shop", root_agent=agent, plugins=[DexConversation(dex)],
              resumability_config=ResumabilityConfig(is_resumable=True))

`dex_adk_tools` returns ADK `BaseTool`s. Each call the model makes is requested through the
ledger (S2, S3) and waited for; the model reads exactly the record's TOOL message (S4.4) as the
function response's `result`: the result, `Error: ...`, the rejection, or
`OUTCOME_UNKNOWN_TOOL_RESULT` (S4.5). A failed or unknown call is text, never an exception.

The idempotency key (S2.1):

- session id: the ADK session's id, unless `session_id` is given (a string, or a function of
  the tool's `ToolContext`);
- turn id: `turn-<n>`, the count of the model's responses among the session's events up to and
  including the one that made the call (`calls.turn_id`; ADK's own confirmation
  requests are not model responses): the events are what the session service keeps, so the
  count survives a crash and a resumed invocation;
- tool-call id: the function call's `id` (the model's, or the `adk-<uuid>` ADK gives it and
  keeps in the event).

A resumed invocation (`Runner.run_async(..., invocation_id=...)` of a resumable `App`) runs a
function call whose response was never saved again, with the same id: the dex tool asks for the
same key and gets the same record (S2.3), so a write runs once.

Approvals use ADK's tool confirmation: a call whose dex policy asks a person (S1.3) is requested
in dex first (its record waits, with its deadline), then the tool calls
`tool_context.request_confirmation(hint=..., payload={"dex_key", "tool", "arguments",
"approval_deadline"})` (secret arguments shown as `***`), so the run emits ADK's
`adk_request_confirmation` function call; a resumable `App` pauses the invocation there. Until a
person answers, the model reads that the call waits for a person and has not run. Answer with
ADK's own response, a `FunctionResponse(name="adk_request_confirmation", id=<that call's id>,
response={"confirmed": bool, "payload": {"decided_by": ..., "reason": ...}})`: confirming records
who decided (`decided_by`, else `approver`) and runs the call; declining records it `rejected`
with who decided and the reason, and the model reads the record's rejection text. A payload
with other `args` than the model asked for is refused, as everywhere (`CHANGED_ARGUMENTS_REASON`).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any, Unpack

from google.adk.agents.callback_context import CallbackContext
from google.adk.agents.invocation_context import InvocationContext
from google.adk.events.event import Event
from google.adk.models.llm_request import LlmRequest
from google.adk.models.llm_response import LlmResponse
from google.adk.plugins.base_plugin import BasePlugin
from google.adk.tools.base_tool import BaseTool
from google.adk.tools.tool_context import ToolContext
from google.genai import types

from dex_celery.client.dex_client import AsyncDexClient, DexClient
from dex_celery.engine import RuntimeSource
from dex_celery.integrations.conversation import Conversation
from dex_celery.integrations.frameworks import calls
from dex_celery.model.conversation import DEX_MESSAGE_ID, SeenMessage
from dex_celery.model.records import Message, MessageRole, ToolCallRecord
from dex_celery.tools.signature_schema import arguments_schema
from dex_celery.tools.tool import Tool

#: Who decided, in dex's record, when the confirmation's payload does not say.
DEFAULT_APPROVER = "google-adk"
#: The function call ADK emits to ask a person to confirm a tool call.
CONFIRMATION_CALL = "adk_request_confirmation"
#: The author of a session event that is a user's message.
USER_AUTHOR = "user"
#: How far apart (seconds) the stored messages handed to the model are timestamped, before its
#: reply: well above the microsecond a database session service keeps.
STORED_TICK = 1e-5

SessionIdSource = str | Callable[[ToolContext], str]


def dex_adk_tools(
    dex: RuntimeSource | DexClient | AsyncDexClient,
    names: Sequence[str] | None = None,
    *,
    session_id: SessionIdSource | None = None,
    **options: Unpack[calls.AdapterOptions],
) -> list[BaseTool]:
    """ADK tools of the named dex tools (all registered tools by default).

    A call still running after a few seconds reports its progress (`CallProgress`) to
    `progress` and to the log."""
    bridge = _Bridge(calls.runtime_source(dex), session_id, options)
    return [DexAdkTool(tool, bridge) for tool in calls.select_tools(bridge.source, names)]


class _Bridge(calls.FrameworkBridge[ToolContext]):
    framework = "Google ADK"
    default_approver = DEFAULT_APPROVER


class DexAdkTool(BaseTool):
    """One dex tool as an ADK tool (built by `dex_adk_tools`)."""

    def __init__(self, tool: Tool, bridge: _Bridge) -> None:
        super().__init__(name=tool.name, description=tool.description or tool.name)
        self.tool = tool
        self.bridge = bridge

    def _get_declaration(self) -> types.FunctionDeclaration | None:
        return types.FunctionDeclaration(
            name=self.name,
            description=self.description,
            parameters_json_schema=arguments_schema(self.tool),
        )

    # --- the call ------------------------------------------------------------------------------

    def framework_call(
        self, tool_context: ToolContext, args: dict[str, Any]
    ) -> calls.FrameworkCall:
        """The call this context belongs to: the session, its turn among the session's events,
        the function call's id, and the conversation that led to it."""
        call_id = tool_context.function_call_id or ""
        session = self.bridge.session(tool_context, lambda: tool_context.session.id)
        events = tool_context.session.events
        turn = calls.turn_id(
            calls.responses_through(
                events,
                _is_model_response,
                lambda e: any(call.id == call_id for call in e.get_function_calls()),
            )
        )
        return calls.FrameworkCall(session, turn, call_id, self.tool, args, seen_events(events))

    async def run_async(self, *, args: dict[str, Any], tool_context: ToolContext) -> Any:
        call = self.framework_call(tool_context, args)

        async def ask(record: ToolCallRecord) -> calls.Decision | None:
            """ADK's tool confirmation: asked for now (the call waits, and the model reads so),
            or the person's answer to it."""
            confirmation = tool_context.tool_confirmation
            if confirmation is None:
                tool_context.request_confirmation(
                    hint=f"dex-celery: {self.tool.name} waits for a person's approval "
                    f"({record.key})",
                    payload=await self.bridge.ashown(call, record),
                )
                return None
            return confirmed_decision(args, confirmation.confirmed, confirmation.payload)

        return await self.bridge.acall(call, ask)


def confirmed_decision(asked: Mapping[str, Any], confirmed: bool, payload: Any) -> calls.Decision:
    """The person's answer in ADK's confirmation (`{"decided_by", "reason"}` in its payload); a
    payload with other `args` than the model asked for is refused."""
    answer = payload if isinstance(payload, Mapping) else {}
    by = answer.get("decided_by")
    reason = answer.get("reason")
    edited = "args" in answer and not calls.same_arguments(asked, answer["args"] or {})
    return calls.Decision(
        confirmed and not edited,
        by if isinstance(by, str) and by else None,
        reason if isinstance(reason, str) else None,
        edited=edited,
    )


# --- one conversation (S12.1) -------------------------------------------------------------------


class DexConversation(BasePlugin):
    """An ADK plugin: before each model request, the session's user and model texts are copied
    into the dex session, and the session's user messages written through dex that the ADK
    session does not hold yet (reconciliation reports first) are added to the request, so the
    model reads them now. They are stored in the session (user events, `Content(role="user")`,
    `custom_metadata={"dex_message_id": ...}`, appended through the session service) right
    before the model's reply to them, timestamped just before it: a session service that reads
    events back in timestamp order (`DatabaseSessionService`) gives the question, the report,
    then the reply, as the model read them. A resumed invocation or the next run is not handed
    them again; a model request that got no reply (an error, a crash) stored nothing, so the
    next request is handed them again. The session is the ADK session's id, unless
    `session_id` is given (a string, or a function of the `CallbackContext`), as for
    `dex_adk_tools`.

        runner = Runner(app=App(name="shop", root_agent=agent, plugins=[DexConversation(dex)]),
                        session_service=...)
    """

    def __init__(
        self,
        dex: RuntimeSource | DexClient | AsyncDexClient,
        *,
        session_id: str | Callable[[CallbackContext], str] | None = None,
        name: str = "dex_conversation",
    ) -> None:
        super().__init__(name=name)
        self.conversation = Conversation(calls.runtime_source(dex))
        self.session_id = session_id
        #: Per invocation: the messages handed to its model request whose reply is not stored yet.
        self._unstored: dict[str, list[Message]] = {}

    def _session(self, callback_context: CallbackContext) -> str:
        return calls.resolve_session(
            self.session_id, callback_context, lambda: callback_context.session.id
        )

    async def before_model_callback(
        self, *, callback_context: CallbackContext, llm_request: LlmRequest
    ) -> LlmResponse | None:
        adk_session = callback_context.session
        session = self._session(callback_context)
        seen = seen_events(adk_session.events)
        await self.conversation.arecord(session, seen)
        texts = [m.text for m in seen if m.role is MessageRole.USER]
        pending = await self.conversation.aundelivered(session, texts)
        invocation = callback_context.get_invocation_context().invocation_id
        self._unstored.pop(invocation, None)
        if pending:
            self._unstored[invocation] = pending
            llm_request.contents.extend(_user_content(m) for m in pending)
        return None

    async def on_event_callback(
        self, *, invocation_context: InvocationContext, event: Event
    ) -> Event | None:
        """Store the messages handed to the model right before its reply (the first whole
        event after the request), which the runner stores next."""
        if event.partial:
            return None
        pending = self._unstored.pop(invocation_context.invocation_id, None)
        if not pending:
            return None
        adk_session = invocation_context.session
        earlier = adk_session.events[-1].timestamp if adk_session.events else None
        for message, at in zip(
            pending, times_before(event.timestamp, earlier, len(pending)), strict=True
        ):
            handed = Event(
                invocation_id=invocation_context.invocation_id,
                author=USER_AUTHOR,
                content=_user_content(message),
                custom_metadata={DEX_MESSAGE_ID: message.id},
                timestamp=at,
            )
            await invocation_context.session_service.append_event(adk_session, handed)
        return None

    async def after_run_callback(self, *, invocation_context: InvocationContext) -> None:
        self._unstored.pop(invocation_context.invocation_id, None)


def _user_content(message: Message) -> types.Content:
    return types.Content(role="user", parts=[types.Part(text=message.text or "")])


def times_before(later: float, earlier: float | None, count: int) -> list[float]:
    """`count` increasing timestamps after `earlier` and before `later`, `STORED_TICK` apart
    where the gap allows (closer where it does not)."""
    gap = STORED_TICK if earlier is None else (later - earlier) / (count + 1)
    step = max(min(STORED_TICK, gap), 0.0)
    return [later - step * (count - i) for i in range(count)]


def seen_events(events: Sequence[Event]) -> list[SeenMessage]:
    """The user messages and the model's text of an ADK session's events, in order."""
    seen = []
    for event in events:
        content = event.content
        if content is None or not content.parts or event.partial:
            continue
        text = "".join(p.text for p in content.parts if p.text and not p.thought)
        if not text:
            continue
        role = MessageRole.USER if content.role == "user" else MessageRole.ASSISTANT
        seen.append(SeenMessage(role, text))
    return seen


def _is_model_response(event: Event) -> bool:
    """An event holding a response of the model (not ADK's own confirmation request)."""
    content = event.content
    if content is None or content.role != "model" or event.partial or not content.parts:
        return False
    function_calls = [p.function_call for p in content.parts if p.function_call is not None]
    return not function_calls or any(c.name != CONFIRMATION_CALL for c in function_calls)
