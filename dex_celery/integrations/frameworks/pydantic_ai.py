"""dex tools for a Pydantic AI `Agent`: each tool call runs on a Celery worker through dex-celery.

    from dex_celery.integrations.frameworks.pydantic_ai import DexTools

    agent = Agent(model, capabilities=[DexTools(dex, ["lookup", "cancel"])],
                  output_type=[str, DeferredToolRequests])

`DexTools` is a Pydantic AI capability: it gives the agent the tools (a `FunctionToolset`) and
records in dex the calls a person denied. Each call the model makes is requested through the
ledger (S2, S3) and waited for; the model reads exactly the record's TOOL message (S4.4): the
result, `Error: ...`, the rejection, or `OUTCOME_UNKNOWN_TOOL_RESULT` (S4.5). A failed or unknown
call is text for the model, never an exception that ends the run, and never something Pydantic
AI retries: whether a call may run again is the call's effect class, decided in dex (S3).

The idempotency key (S2.1):

- session id: the run's conversation id (`conversation_id=` of `Agent.run`, or the one stamped
  on the message history, so a run resumed from its messages keeps it), unless `session_id` is
  given (a string, or a function of the `RunContext`);
- turn id: `turn-<n>`, the count of model responses in the message history up to and including
  the one that made the call (`calls.turn_id`), read from the history itself;
- tool-call id: the model's `tool_call_id`.

So running the agent again on the same message history (after a crash, or to answer deferred
calls) asks for the same keys and gets the same records back: a write that ran is not run again.

Approvals use Pydantic AI's deferred tools: a call whose dex policy asks a person (S1.3) is
requested in dex first (its record waits, with its deadline, in `dex-celery approvals`) and then
raises `ApprovalRequired`, so the run ends with `DeferredToolRequests` (its metadata carries the
dex key and deadline). Answer with `DeferredToolResults`:

- `ToolApproved()` (or `True`): the call is approved in dex and runs; who decided is
  `metadata[tool_call_id]["decided_by"]` of the results, else `approver`;
- `ToolDenied(message)` (or `False`): the call is recorded `rejected` in dex, by `approver`
  (Pydantic AI hands a denial's metadata to no hook), with the message as the reason, and the model
  reads the record's rejection text;
- `ToolApproved(override_args=...)`: refused. An approval is of the arguments the model asked for;
  approving other arguments would run a call nobody asked dex for under the original call's key.
  The call is recorded `rejected` (reason `CHANGED_ARGUMENTS_REASON`) and the model reads that, so
  it can call the tool again with the new arguments as a new call with its own record.

One conversation (S12.1): before each model request and at each call, the history's user
prompts and the model's text are copied into the dex session (scrubbed of the call's secrets),
and the session's user messages written through dex that the history does not hold yet (the
reconciler's reports) are added with `ctx.enqueue`, so the model reads them once and the history
the run returns keeps them. A call still running after a few seconds reports to `progress`.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from pydantic_ai import RunContext
from pydantic_ai.capabilities import AbstractCapability
from pydantic_ai.exceptions import ApprovalRequired
from pydantic_ai.messages import (
    ModelRequest,
    ModelResponse,
    TextPart,
    ToolCallPart,
    ToolReturnPart,
    UserPromptPart,
)
from pydantic_ai.models import ModelRequestContext
from pydantic_ai.tools import Tool as PydanticTool
from pydantic_ai.toolsets import AbstractToolset, FunctionToolset

from dex_celery.client.dex_client import AsyncDexClient, DexClient
from dex_celery.engine import RuntimeSource
from dex_celery.errors import DexError
from dex_celery.integrations.frameworks.calls import (
    Decision,
    FrameworkBridge,
    FrameworkCall,
    ProgressCallback,
    record_text,
    responses_through,
    runtime_source,
    same_arguments,
    select_tools,
    turn_id,
)
from dex_celery.model.conversation import DEX_MESSAGE_ID, SeenMessage
from dex_celery.model.records import MessageRole, ToolCallRecord
from dex_celery.tools.signature_schema import arguments_schema
from dex_celery.tools.tool import Tool

log = logging.getLogger(__name__)

#: Who decided, in dex's record, when the deferred tool results do not say.
DEFAULT_APPROVER = "pydantic-ai"
#: The key of `DeferredToolResults.metadata[tool_call_id]` that names who approved.
DECIDED_BY = "decided_by"

SessionIdSource = str | Callable[[RunContext[Any]], str]


@dataclass
class DexTools(AbstractCapability[Any]):
    """The named dex tools (all registered tools by default) as a Pydantic AI capability."""

    dex: RuntimeSource | DexClient | AsyncDexClient
    names: Sequence[str] | None = None
    session_id: SessionIdSource | None = field(default=None, kw_only=True)
    approver: str = field(default=DEFAULT_APPROVER, kw_only=True)
    wait_timeout: float = field(default=300.0, kw_only=True)
    progress: ProgressCallback | None = field(default=None, kw_only=True)
    toolset: FunctionToolset[Any] = field(init=False, repr=False)

    def __post_init__(self) -> None:
        self._bridge = _Bridge(
            runtime_source(self.dex),
            self.session_id,
            {
                "approver": self.approver,
                "wait_timeout": self.wait_timeout,
                "progress": self.progress,
            },
        )
        self._tools = {t.name: t for t in select_tools(self._bridge.source, self.names)}
        self.toolset = FunctionToolset([self._pydantic_tool(tool) for tool in self._tools.values()])

    @classmethod
    def get_serialization_name(cls) -> str | None:
        return None  # holds a deployment, not a spec

    def get_toolset(self) -> AbstractToolset[Any] | None:
        return self.toolset

    # --- ids -----------------------------------------------------------------------------------

    def session_of(self, ctx: RunContext[Any]) -> str:
        """The dex session of this run: `session_id`, else the conversation id, else the run."""
        return self._bridge.session(ctx, lambda: ctx.conversation_id or ctx.run_id or "")

    def key_ids(self, ctx: RunContext[Any], tool_call_id: str) -> tuple[str, str]:
        """`(session id, turn id)` of the call `tool_call_id` of this run's history."""
        responses = responses_through(
            ctx.messages,
            lambda m: isinstance(m, ModelResponse),
            lambda m: (
                isinstance(m, ModelResponse)
                and any(call.tool_call_id == tool_call_id for call in m.tool_calls)
            ),
        )
        return self.session_of(ctx), turn_id(responses)

    # --- the tool ------------------------------------------------------------------------------

    def _pydantic_tool(self, tool: Tool) -> PydanticTool[Any]:
        async def call(ctx: RunContext[Any], **arguments: Any) -> str:
            return await self.invoke(tool, ctx, arguments)

        return PydanticTool.from_schema(
            call,
            name=tool.name,
            description=tool.description or tool.name,
            json_schema=arguments_schema(tool),
            takes_ctx=True,
        )

    async def invoke(self, tool: Tool, ctx: RunContext[Any], arguments: dict[str, Any]) -> str:
        call_id = ctx.tool_call_id or ""
        session, turn = self.key_ids(ctx, call_id)
        asked = _asked_arguments(ctx.messages, call_id)
        if ctx.tool_call_approved and asked is not None and not same_arguments(asked, arguments):
            # `override_args` is refused: the call asked for is recorded rejected, and the
            # history was copied before the model request that made it.
            refused = FrameworkCall(session, turn, call_id, tool, asked, history=None)
            edited = Decision(False, self._decided_by(ctx), None, edited=True)
            return await self._bridge.acall(refused, _answer(edited))
        call = FrameworkCall(session, turn, call_id, tool, arguments, seen_messages(ctx.messages))

        async def ask(record: ToolCallRecord) -> Decision:
            """Approved in this run (deferred tool results), or deferred: the run ends with
            `DeferredToolRequests`, whose metadata names the dex call."""
            if not ctx.tool_call_approved:
                preview = await self._bridge.decisions.apreview(record)
                raise ApprovalRequired(
                    metadata={
                        "dex_key": record.key,
                        "approval_deadline": record.approval_deadline,
                        **({"preview": preview} if preview is not None else {}),
                    }
                )
            return Decision(True, self._decided_by(ctx), None)

        return await self._bridge.acall(call, ask)

    def _decided_by(self, ctx: RunContext[Any]) -> str:
        metadata = ctx.tool_call_metadata
        if isinstance(metadata, dict) and isinstance(metadata.get(DECIDED_BY), str):
            return str(metadata[DECIDED_BY])
        return self.approver

    # --- denials -------------------------------------------------------------------------------

    async def before_model_request(
        self, ctx: RunContext[Any], request_context: ModelRequestContext
    ) -> ModelRequestContext:
        """Before each model request: copy the history into the session; hand the model the
        session's user messages written through dex that the history does not hold yet
        (reconciliation reports first); record in dex the calls a person denied, giving the
        model the record's text.

        The messages go in with `ctx.enqueue`, Pydantic AI's own way to add to a request and to
        the run's history, each as a `ModelRequest` whose metadata names the dex message: the
        model reads it now, and the history the run returns holds it, so a run resumed from that
        history is not handed it again (docs/frameworks.md, "One conversation").

        Pydantic AI answers a `ToolDenied` without calling the tool; its `denied` tool return is
        in the history by the next model request, which is where it is found here.
        """
        await self._hand_over(ctx)
        rewritten: dict[int, ModelRequest] = {}
        for history in (ctx.messages, request_context.messages):
            if not history or not isinstance(history[-1], ModelRequest):
                continue
            request = history[-1]
            if id(request) not in rewritten:
                rewritten[id(request)] = await self._with_denials_recorded(ctx, request)
            history[-1] = rewritten[id(request)]
        return request_context

    async def _hand_over(self, ctx: RunContext[Any]) -> None:
        session = self.session_of(ctx)
        if not session:
            return
        seen = seen_messages(ctx.messages)
        await self._bridge.conversation.arecord(session, seen)
        user_texts = [m.text for m in seen if m.role is MessageRole.USER]
        for message in await self._bridge.conversation.aundelivered(session, user_texts):
            ctx.enqueue(
                ModelRequest(
                    parts=[UserPromptPart(message.text or "")],
                    metadata={DEX_MESSAGE_ID: message.id},
                )
            )

    async def _with_denials_recorded(
        self, ctx: RunContext[Any], request: ModelRequest
    ) -> ModelRequest:
        parts = list(request.parts)
        changed = False
        for index, part in enumerate(parts):
            if (
                isinstance(part, ToolReturnPart)
                and part.outcome == "denied"
                and part.tool_name in self._tools
            ):
                text = await self._record_denial(ctx, part)
                if text is not None and text != part.content:
                    denied: ToolReturnPart[Any] = part
                    parts[index] = replace(denied, content=text)
                    changed = True
        return replace(request, parts=parts) if changed else request

    async def _record_denial(self, ctx: RunContext[Any], part: ToolReturnPart) -> str | None:
        session, turn = self.key_ids(ctx, part.tool_call_id)
        arguments = _asked_arguments(ctx.messages, part.tool_call_id) or {}
        reason = part.content if isinstance(part.content, str) else None
        try:
            record: ToolCallRecord = await self._bridge.decisions.aclient.request_call(
                session, turn, part.tool_call_id, part.tool_name, arguments
            )
            record = await self._bridge.arecord_decision(record, Decision(False, None, reason))
        except DexError as e:
            log.warning("could not record the denial of %s in dex: %s", part.tool_call_id, e)
            return None
        if not record.finished:
            return None
        return record_text(record)


class _Bridge(FrameworkBridge[RunContext[Any]]):
    framework = "Pydantic AI"
    default_approver = DEFAULT_APPROVER


def _answer(decision: Decision) -> Callable[[ToolCallRecord], Awaitable[Decision]]:
    async def ask(record: ToolCallRecord) -> Decision:
        return decision

    return ask


def seen_messages(messages: Sequence[Any]) -> list[SeenMessage]:
    """The user prompts and the model's text of a Pydantic AI history, in order."""
    seen = []
    for message in messages:
        if isinstance(message, ModelRequest):
            for part in message.parts:
                if isinstance(part, UserPromptPart):
                    text = _user_text(part.content)
                    if text:
                        seen.append(SeenMessage(MessageRole.USER, text))
        elif isinstance(message, ModelResponse):
            text = "".join(p.content for p in message.parts if isinstance(p, TextPart))
            if text:
                seen.append(SeenMessage(MessageRole.ASSISTANT, text))
    return seen


def _user_text(content: Any) -> str:
    if isinstance(content, str):
        return content
    return "\n".join(item for item in content if isinstance(item, str))


def _asked_arguments(messages: Sequence[Any], tool_call_id: str) -> dict[str, Any] | None:
    """The arguments the model gave the call `tool_call_id`, from the history."""
    for message in reversed(messages):
        if isinstance(message, ModelResponse):
            for call in message.tool_calls:
                if isinstance(call, ToolCallPart) and call.tool_call_id == tool_call_id:
                    return call.args_as_dict()
    return None
