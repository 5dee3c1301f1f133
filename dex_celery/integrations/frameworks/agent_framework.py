"""dex tools for a Microsoft Agent Framework `Agent`: its tool calls run on Celery workers.

    from dex_celery.integrations.frameworks.agent_framework import DexTools

    agent = Agent(client, context_providers=[DexTools(dex, ["lookup", "refund"])])
    session = agent.create_session(session_id="conv-7")
    result = await agent.run("Refund order 1002.", session=session)

`DexTools` is an Agent Framework context provider: before each run it gives the agent the dex
tools (`FunctionTool`s, `DexTools.tools`), the middleware that keys, decides and mirrors their
calls, and the session's messages written through dex. Each call the model makes is requested
through the ledger (S2, S3) and waited for; the model reads exactly the record's TOOL message
(S4.4) as the function result: the result, `Error: ...`, the rejection, or
`OUTCOME_UNKNOWN_TOOL_RESULT` (S4.5). A failed or unknown call is text, never an exception the
framework would count as a tool error.

The idempotency key (S2.1):

- session id: the `AgentSession`'s `session_id`, unless `session_id` is given (a string, or a
  function of the `AgentSession`);
- turn id: `turn-<n>`, the count of model responses of the conversation up to and including the
  one that made the call (`calls.turn_id`). `DexTools`'s chat middleware counts them
  in each model request and keeps, in the session's state (`session.state["dex"]["turns"]`,
  saved with the session), the turn of each call the response made, so a run resumed from the
  saved session (an approval answered) asks for the same key; on a client whose chat middleware
  wraps the whole function loop rather than each model request, a call is counted in the run's
  first response;
- tool-call id: the function call's `call_id`.

Approvals use the framework's own function approval flow: a call whose dex policy asks a person
(S1.3) is requested in dex first (its record waits, with its deadline, in `dex-celery
approvals`), then the tool answers with a `function_approval_request` content, so the run ends
with it in `result.user_input_requests`; its `additional_properties["dex"]` is
`{"dex_key", "tool", "arguments", "approval_deadline"}` (secret arguments `***`; `"preview"` for
a tool with a preview function). Answer as the framework's users do, with the request's
`to_function_approval_response(approved)` as the next run's input (`decision(...)` adds who
decided and why in its `additional_properties`, `{"decided_by", "reason"}`):

- approved: the call is approved in dex by `decided_by` (else `approver`) and runs once;
- rejected: the call is recorded `rejected` in dex with who decided and the reason, and the
  model reads the record's rejection text instead of the framework's;
- approved with other arguments in the response's `function_call` than the model asked for:
  refused, as in every adapter (`CHANGED_ARGUMENTS_REASON`), recorded `rejected` and not run.

One conversation (S12.1): before each run the session's history and input are copied into the
dex session (and again after each model response, before its calls are requested, scrubbed of
each call's secrets), and the session's user messages written through dex that the history does
not hold yet (reconcile reports first) are appended to the run's input messages: the model reads
them after the user's new message, and the history provider stores them with that input, before
the reply, once the run ends. A run that ended without storing its messages (a crash) stored
nothing, so the next run is handed them again; a history that holds them is never handed them
twice. `DexTools` reads the history its history provider loaded: list it after that provider
(the `InMemoryHistoryProvider` the agent adds by default comes first).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Awaitable, Callable, Mapping, MutableMapping, Sequence
from typing import Any, Unpack

from agent_framework import (
    AgentSession,
    ChatContext,
    ChatMiddleware,
    ChatResponse,
    ContextProvider,
    FunctionInvocationContext,
    FunctionMiddleware,
    FunctionTool,
    Message,
    SessionContext,
    SupportsAgentRun,
)
from agent_framework import Content as AfContent

from dex_celery.client.dex_client import AsyncDexClient, DexClient
from dex_celery.engine import RuntimeSource
from dex_celery.errors import DexError, UnknownCall
from dex_celery.integrations.conversation import call_secrets
from dex_celery.integrations.frameworks import calls
from dex_celery.model.conversation import DEX_MESSAGE_ID, SeenMessage
from dex_celery.model.records import MessageRole, ToolCallRecord
from dex_celery.tools.signature_schema import arguments_schema
from dex_celery.tools.tool import Tool

log = logging.getLogger(__name__)

#: Who decided, in dex's record, when the approval response does not say.
DEFAULT_APPROVER = "agent-framework"
#: The keys of an approval response's `additional_properties` naming who decided and why.
DECIDED_BY = "decided_by"
REASON = "reason"
#: The key of an approval request's `additional_properties` holding what the person is shown.
SHOWN = "dex"
#: `DexTools`'s source id: its state in `session.state`, its tools' and messages' attribution.
SOURCE_ID = "dex"
#: The marker the framework puts on the function result of a call a person rejected.
_REJECTED_RESULT = "_approval_rejection_result"
_TURNS = "turns"
_BEFORE_RUN = "responses_before_run"

SessionIdSource = str | Callable[[AgentSession], str]


def decision(
    request: AfContent, approved: bool, *, decided_by: str | None = None, reason: str | None = None
) -> AfContent:
    """The framework's answer to an approval request (`request.to_function_approval_response`)
    naming who decided and why, for dex's record. Send it as the next run's input:
    `agent.run(Message(role="user", contents=[decision(...)]), session=session)`."""
    response = request.to_function_approval_response(approved)
    properties = dict(response.additional_properties or {})
    properties.pop(SHOWN, None)
    if decided_by is not None:
        properties[DECIDED_BY] = decided_by
    if reason is not None:
        properties[REASON] = reason
    response.additional_properties = properties
    return response


class _Bridge(calls.FrameworkBridge[AgentSession]):
    framework = "Microsoft Agent Framework"
    default_approver = DEFAULT_APPROVER


class DexTools(ContextProvider):
    """The named dex tools (all registered tools by default) as an Agent Framework context
    provider: `Agent(client, context_providers=[DexTools(dex, names)])`."""

    def __init__(
        self,
        dex: RuntimeSource | DexClient | AsyncDexClient,
        names: Sequence[str] | None = None,
        *,
        session_id: SessionIdSource | None = None,
        source_id: str = SOURCE_ID,
        **options: Unpack[calls.AdapterOptions],
    ) -> None:
        super().__init__(source_id)
        self.bridge = _Bridge(calls.runtime_source(dex), session_id, options)
        self._tools = {t.name: t for t in calls.select_tools(self.bridge.source, names)}
        #: The Agent Framework tools, one per dex tool.
        self.tools: list[DexFunctionTool] = [DexFunctionTool(t, self) for t in self._tools.values()]
        self._middleware: list[FunctionMiddleware | ChatMiddleware] = [_DexCalls(), _DexTurns(self)]

    # --- ids -------------------------------------------------------------------------------------

    def session_of(self, session: AgentSession | None) -> str:
        """The dex session of an Agent Framework session."""
        if session is None:
            source = self.bridge.session_id
            return source if isinstance(source, str) else ""
        return self.bridge.session(session, lambda: session.session_id)

    def state_of(self, session: AgentSession | None) -> dict[str, Any]:
        """`DexTools`'s part of the session's state (saved with the session)."""
        if session is None:
            return {}
        state: dict[str, Any] = session.state.setdefault(self.source_id, {})
        return state

    def turn_of(self, session: AgentSession | None, call_id: str) -> str:
        """The turn id of the call `call_id` (the rule in the module docstring)."""
        state = self.state_of(session)
        turns = state.get(_TURNS) or {}
        if call_id in turns:
            return calls.turn_id(int(turns[call_id]))
        return calls.turn_id(int(state.get(_BEFORE_RUN, 0)) + 1)

    def key_of(self, session: AgentSession | None, call_id: str) -> tuple[str, str]:
        return self.session_of(session), self.turn_of(session, call_id)

    # --- the run ---------------------------------------------------------------------------------

    async def before_run(
        self,
        *,
        agent: SupportsAgentRun,
        session: AgentSession,
        context: SessionContext,
        state: dict[str, Any],
    ) -> None:
        """Give the run the tools and middleware; count the turns of the calls the history
        holds; record the decisions of the input's approval responses; copy the history into
        the dex session; hand the model the messages written through dex it does not hold."""
        context.extend_tools(self.source_id, self.tools)
        context.extend_middleware(self.source_id, list(self._middleware))
        history = context.get_messages(include_input=True)
        note_turns(state.setdefault(_TURNS, {}), history)
        state[_BEFORE_RUN] = model_responses(history)
        dex_session = self.session_of(session)
        await self._record_decisions(session, context.input_messages)
        seen = seen_messages(history)
        await self.bridge.conversation.arecord(dex_session, seen)
        user_texts = [m.text for m in seen if m.role is MessageRole.USER]
        for message in await self.bridge.conversation.aundelivered(dex_session, user_texts):
            context.input_messages.append(
                Message(
                    role="user",
                    contents=[AfContent.from_text(message.text or "")],
                    additional_properties={DEX_MESSAGE_ID: message.id},
                )
            )

    async def _record_decisions(self, session: AgentSession, inputs: Sequence[Message]) -> None:
        """A person's rejections (and approvals with changed arguments) are recorded in dex now;
        the framework never calls a tool it was told not to run. Approvals are recorded by the
        tool when the framework runs it."""
        for message in inputs:
            for content in message.contents:
                call = content.function_call
                if (
                    content.type != "function_approval_response"
                    or call is None
                    or call.name not in self._tools
                    or not call.call_id
                ):
                    continue
                await self._record_decision(session, content, call)

    async def _record_decision(
        self, session: AgentSession, response: AfContent, call: AfContent
    ) -> None:
        tool = self._tools[str(call.name)]
        asked = dict(call.parse_arguments() or {})
        dex_session, turn = self.key_of(session, str(call.call_id))
        decisions = self.bridge.decisions
        try:
            try:
                record = await decisions.aclient.get_call(f"{dex_session}/{turn}/{call.call_id}")
            except UnknownCall:
                record = await decisions.aclient.request_call(
                    dex_session, turn, str(call.call_id), tool.name, asked
                )
            who, reason = self.decided_by(response)
            edited = bool(response.approved) and not calls.same_arguments(
                json.loads(record.arguments), asked
            )
            if edited or not response.approved:
                await self.bridge.arecord_decision(
                    record, calls.Decision(False, who, reason, edited)
                )
        except DexError as e:
            # The tool, or the model's next request, reads what the record says.
            log.warning("could not record the decision on %s in dex: %s", call.call_id, e)

    def decided_by(self, response: AfContent | None) -> tuple[str, str | None]:
        """Who decided (the response's `decided_by`, else `approver`) and why."""
        properties = (response.additional_properties or {}) if response is not None else {}
        by = properties.get(DECIDED_BY)
        reason = properties.get(REASON)
        return (
            by if isinstance(by, str) and by else self.bridge.approver,
            reason if isinstance(reason, str) and reason else None,
        )

    # --- model requests (the chat middleware) ---------------------------------------------------

    async def before_model(self, session: AgentSession | None, messages: Sequence[Message]) -> None:
        """Replace the framework's text for a rejected dex call with the record's text."""
        for message in messages:
            for index, content in enumerate(message.contents):
                if content.type != "function_result" or not content.call_id:
                    continue
                if not (content.additional_properties or {}).get(_REJECTED_RESULT):
                    continue
                text = await self._rejection_text(session, content.call_id)
                if text is not None:
                    message.contents[index] = AfContent.from_function_result(
                        call_id=content.call_id,
                        id=content.id,
                        result=text,
                        additional_properties=content.additional_properties,
                    )

    async def _rejection_text(self, session: AgentSession | None, call_id: str) -> str | None:
        dex_session, turn = self.key_of(session, call_id)
        try:
            record = await self.bridge.decisions.aclient.get_call(f"{dex_session}/{turn}/{call_id}")
        except DexError:
            return None
        return calls.record_text(record) if record.finished else None

    async def after_model(
        self, session: AgentSession | None, messages: Sequence[Message], response: ChatResponse
    ) -> None:
        """Note the turn of each call the response made, and copy the conversation so far into
        the dex session before the calls are requested."""
        turn = model_responses(messages) + 1
        turns = self.state_of(session).setdefault(_TURNS, {})
        secrets: dict[str, Any] = {}
        for message in response.messages:
            for content in message.contents:
                if content.type == "function_call" and content.call_id:
                    turns[content.call_id] = turn
                    tool = self._tools.get(str(content.name))
                    if tool is not None:
                        arguments = dict(content.parse_arguments() or {})
                        for name, value in call_secrets(tool, arguments).items():
                            secrets[f"{content.call_id}.{name}"] = value
        dex_session = self.session_of(session)
        if dex_session:
            seen = seen_messages([*messages, *response.messages])
            await self.bridge.conversation.arecord(dex_session, seen, secrets)


class _DexTurns(ChatMiddleware):
    """Around each model request: rejections read from the record, turns noted."""

    def __init__(self, owner: DexTools) -> None:
        self.owner = owner

    async def process(self, context: ChatContext, call_next: Callable[[], Awaitable[None]]) -> None:
        await self.owner.before_model(context.session, context.messages)
        await call_next()
        result = context.result
        if isinstance(result, ChatResponse):
            await self.owner.after_model(context.session, context.messages, result)
        elif context.stream:
            messages, session = list(context.messages), context.session

            async def noted(response: ChatResponse[Any]) -> None:
                await self.owner.after_model(session, messages, response)

            context.stream_result_hooks.append(noted)


class _DexCalls(FunctionMiddleware):
    """Present so the framework runs dex tools through its middleware pipeline, which hands a
    tool the call's id, its approval response, and passes a tool's approval request on."""

    async def process(
        self, context: FunctionInvocationContext, call_next: Callable[[], Awaitable[None]]
    ) -> None:
        await call_next()


def _not_called(**arguments: Any) -> str:  # pragma: no cover - DexFunctionTool.invoke runs instead
    raise NotImplementedError("a dex tool runs through DexFunctionTool.invoke")


class DexFunctionTool(FunctionTool):
    """One dex tool as an Agent Framework `FunctionTool` (built by `DexTools`)."""

    def __init__(self, tool: Tool, owner: DexTools) -> None:
        super().__init__(
            name=tool.name,
            description=tool.description or tool.name,
            func=_not_called,
            input_model=arguments_schema(tool),
        )
        self.tool = tool
        self.owner = owner

    async def invoke(  # type: ignore[override]
        self,
        *,
        arguments: Any = None,
        context: FunctionInvocationContext | None = None,
        tool_call_id: str | None = None,
        **kwargs: Any,
    ) -> str | AfContent:
        """Request the call in dex and return what the model reads, or the framework's
        approval request for a call that waits for a person."""
        args = _as_arguments(
            arguments if arguments is not None else getattr(context, "arguments", {})
        )
        session = context.session if context is not None else None
        metadata: MutableMapping[str, Any] = context.metadata if context is not None else {}
        call_id = tool_call_id or str(metadata.get("call_id") or "")
        dex_session, turn = self.owner.key_of(session, call_id)
        # The messages that led to the call were copied after the model's response
        # (`DexTools.after_model`); the request scrubs those copies of the call's secrets.
        call = calls.FrameworkCall(dex_session, turn, call_id, self.tool, args, history=())

        async def ask(record: ToolCallRecord) -> calls.Decision | AfContent:
            """Approved in the framework (its approval response), or asked for: the run ends
            with the framework's own approval request."""
            response = metadata.get("approval_response")
            if not isinstance(response, AfContent) or not response.approved:
                return await self._approval_request(call, record, metadata)
            return calls.Decision(True, self.owner.decided_by(response)[0], None)

        return await self.owner.bridge.acall(call, ask)

    async def _approval_request(
        self, call: calls.FrameworkCall, record: ToolCallRecord, metadata: Mapping[str, Any]
    ) -> AfContent:
        occurrence = metadata.get("function_call_occurrence_id")
        requested = AfContent.from_function_call(
            call_id=call.call_id,
            name=self.name,
            arguments=dict(call.shown_arguments()),
            id=occurrence if isinstance(occurrence, str) else None,
        )
        return AfContent.from_function_approval_request(
            id=requested.id or call.call_id,
            function_call=requested,
            additional_properties={SHOWN: await self.owner.bridge.ashown(call, record)},
        )


def _as_arguments(arguments: Any) -> dict[str, Any]:
    if isinstance(arguments, Mapping):
        return dict(arguments)
    dump = getattr(arguments, "model_dump", None)
    return dict(dump(exclude_unset=True)) if callable(dump) else {}


# --- the history ---------------------------------------------------------------------------------


def model_responses(messages: Sequence[Message]) -> int:
    """How many model responses `messages` hold: each run of consecutive assistant messages is
    one (the framework keeps a response's calls and its approval requests in one message)."""
    count, previous = 0, ""
    for message in messages:
        if message.role == "assistant" and previous != "assistant":
            count += 1
        previous = str(message.role)
    return count


def note_turns(turns: dict[str, int], messages: Sequence[Message]) -> None:
    """`call id -> n` for each function call of `messages`, made by their n-th model response."""
    count, previous = 0, ""
    for message in messages:
        if message.role == "assistant" and previous != "assistant":
            count += 1
        previous = str(message.role)
        if message.role != "assistant":
            continue
        for content in message.contents:
            if content.type == "function_call" and content.call_id:
                turns.setdefault(content.call_id, count)


def seen_messages(messages: Sequence[Message]) -> list[SeenMessage]:
    """The user messages and the model's text of an Agent Framework history, in order."""
    seen = []
    for message in messages:
        if message.role not in ("user", "assistant"):
            continue
        text = "".join(c.text or "" for c in message.contents if c.type == "text")
        if not text:
            continue
        role = MessageRole.USER if message.role == "user" else MessageRole.ASSISTANT
        seen.append(SeenMessage(role, text))
    return seen
