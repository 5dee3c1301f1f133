"""dex tools as CrewAI tools: a crew's (or a flow's agent's) tool calls run on Celery workers.

    from dex_celery.integrations.frameworks.crewai import dex_crewai_tools

    agent = Agent(role="desk", goal=..., backstory=..., llm=llm,
                  tools=dex_crewai_tools(dex, ["lookup", "refund"]))

`dex_crewai_tools` returns CrewAI `BaseTool`s. Each call the model makes is requested through
the ledger (S2, S3) and waited for; the model reads exactly the record's TOOL message (S4.4).

CrewAI hands a tool its arguments only. The call's identity comes from CrewAI's own
`before_tool_call` hook (registered once, by the first `dex_crewai_tools`), which sees the
agent's executor: the model response that made the call is the executor's last assistant
message with tool calls, and the call whose tool and arguments match is this one (identical
calls of one response take its ids in order). The key is
`<session>/<run>.turn-<n>/<the model's tool call id>` (docs/frameworks.md):

- the session is `session_id` (a string, or a function of CrewAI's hook context) or, without
  it, `<crew id>.<task id>`: one session per task of a crew object, shared by every kickoff of
  that crew (a crew restored from its checkpoint keeps both ids; a new `Crew` is a new
  session), the flow's id for an agent run in a flow, or the agent's id for `Agent.kickoff`;
- the run is one task conversation (`run_id`): CrewAI's id of the kickoff (a crew restored from
  its checkpoint keeps it, so a resumed kickoff is the same run) with the task's id, the
  flow's id for an agent in a flow (a flow kicked off again with its id is the same run), or
  the agent's kickoff id; so each kickoff's calls have turn ids of their own;
- `n` counts the model responses of the task's conversation up to and including that one.

Calls made without native function calling (CrewAI's text "Action:" protocol carries no call
id) are refused with a text saying so, never keyed by a guess.

One conversation (S12.1): the hooks copy the task's conversation into the dex session, and
hand the model the session's user messages written through dex (reconcile reports first) at
the session's next run only: CrewAI keeps no history across kickoffs, so the first run to ask
the model after a message was sent takes it (`Conversation.taken`); a later kickoff is never
handed it again, and the same run resumed from its checkpoint is handed it once more.

A call whose dex policy asks a person is recorded in dex, with its approval deadline, before
anyone decides. With `decide=` (a function of the shown request, e.g. one calling CrewAI's
`context.request_human_input` or your own review queue) the person's answer is taken at once:
`True`/`False` or `{"approved": bool, "decided_by": ..., "reason": ...}`, as everywhere
(`calls.Decision`). Without it the model reads that the call waits for a person and
has not run; the person decides in dex (`dex-celery approvals`, the web app), and the task run
again with the same ids (the crew resumed) reads the decision: the result, or the rejection.
"""

from __future__ import annotations

import contextvars
import hashlib
import json
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Unpack

from crewai.flow.flow_context import current_flow_id
from crewai.hooks import register_before_llm_call_hook, register_before_tool_call_hook
from crewai.hooks.llm_hooks import LLMCallHookContext
from crewai.hooks.tool_hooks import ToolCallHookContext
from crewai.tools import BaseTool
from pydantic import BaseModel, ConfigDict, PrivateAttr

from dex_celery.client.dex_client import AsyncDexClient, DexClient
from dex_celery.engine import RuntimeSource
from dex_celery.integrations.frameworks.calls import (
    AdapterOptions,
    Decision,
    FrameworkBridge,
    FrameworkCall,
    runtime_source,
    select_tools,
    turn_id,
)
from dex_celery.model.conversation import SeenMessage
from dex_celery.model.records import MessageRole, ToolCallRecord
from dex_celery.tools.signature_schema import arguments_schema
from dex_celery.tools.tool import Tool

#: Who decided, in dex's record, when `decide` does not say.
DEFAULT_APPROVER = "crewai"
#: What the model reads of a call CrewAI ran without a tool call id.
NO_BRIDGE_TEXT = (
    "Error: the dex tool {tool} did not run: it was restored without its dex deployment (CrewAI "
    "keeps a tool's fields in a checkpoint, not dex's runtime); give the restored agent "
    "dex_crewai_tools(...) again. Nothing was recorded."
)
NO_CALL_ID_TEXT = (
    "Error: the dex tool {tool} did not run: CrewAI ran it without a tool call id (an LLM "
    "without native function calling), so dex could not name the call. Nothing was recorded."
)

HookContext = ToolCallHookContext | LLMCallHookContext
SessionIdSource = str | Callable[[HookContext], str]
#: A person's decision on a waiting call, given the shown request (`shown_request`).
Decide = Callable[[dict[str, Any]], Any]


def dex_crewai_tools(
    dex: RuntimeSource | DexClient | AsyncDexClient,
    names: Sequence[str] | None = None,
    *,
    session_id: SessionIdSource | None = None,
    decide: Decide | None = None,
    **options: Unpack[AdapterOptions],
) -> list[BaseTool]:
    """CrewAI tools of the named dex tools (all registered tools by default).

    A call still running after a few seconds reports its progress (`CallProgress`) to
    `progress` and to the log."""
    source = runtime_source(dex)
    bridge = _Bridge(source, session_id, options, decide)
    _install_hooks()
    return [DexCrewTool.of(tool, bridge) for tool in select_tools(source, names)]


# --- which call a tool runs ---------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class CrewCall:
    """The call a dex tool is about to run, found by the `before_tool_call` hook."""

    tool: str
    session: str
    turn: str
    call_id: str
    history: tuple[SeenMessage, ...]


_CURRENT: contextvars.ContextVar[CrewCall | None] = contextvars.ContextVar(
    "dex_crewai_call", default=None
)


class _Claims:
    """The call ids of the executor's current model response already taken by a tool, so
    identical calls of one response (same tool, same arguments) each get their own id. A call
    asked for more often than its response holds ids takes the last one again: the same key,
    so the same record, never a second call. Kept for the `KEPT` executors seen last."""

    KEPT = 1024

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._taken: dict[int, tuple[dict[str, Any], set[str]]] = {}

    def take(self, executor: object, message: dict[str, Any], candidates: Sequence[str]) -> str:
        with self._lock:
            held = self._taken.get(id(executor))
            if held is None or held[0] is not message:
                held = (message, set())
                self._taken.pop(id(executor), None)
                self._taken[id(executor)] = held
                while len(self._taken) > self.KEPT:
                    del self._taken[next(iter(self._taken))]
            free = [c for c in candidates if c not in held[1]]
            chosen = free[0] if free else candidates[-1]
            held[1].add(chosen)
            return chosen


_CLAIMS = _Claims()
_HOOKS_LOCK = threading.Lock()
_hooks_installed = False


def _install_hooks() -> None:
    """Register the two global hooks once per process; both ignore agents without dex tools."""
    global _hooks_installed
    with _HOOKS_LOCK:
        if not _hooks_installed:
            register_before_tool_call_hook(_before_tool_call)
            register_before_llm_call_hook(_before_llm_call)
            _hooks_installed = True


def _bridge_of(agent: Any) -> _Bridge | None:
    for tool in getattr(agent, "tools", None) or []:
        if isinstance(tool, DexCrewTool):
            return tool.bridge
    return None


class _Executors:
    """The executor each agent with dex tools last asked the model through, seen by the
    `before_llm_call` hook: a crew's agent keeps its executor (`agent.agent_executor`), but
    `Agent.kickoff` (an agent on its own, or in a flow) runs one the agent does not hold, and
    the tool hook is not handed it."""

    KEPT = 1024

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._by_agent: dict[int, Any] = {}

    def saw(self, agent: Any, executor: Any) -> None:
        with self._lock:
            self._by_agent.pop(id(agent), None)
            self._by_agent[id(agent)] = executor
            while len(self._by_agent) > self.KEPT:
                del self._by_agent[next(iter(self._by_agent))]

    def of(self, agent: Any) -> Any:
        with self._lock:
            seen = self._by_agent.get(id(agent))
        return seen if seen is not None else getattr(agent, "agent_executor", None)


_EXECUTORS = _Executors()


def _executor_messages(executor: Any) -> list[dict[str, Any]]:
    messages = getattr(executor, "messages", None)
    return messages if isinstance(messages, list) else []


def _arguments(raw: Any) -> Any:
    if isinstance(raw, str):
        try:
            return json.loads(raw)
        except json.JSONDecodeError:
            return None
    return raw


def _find_call(
    messages: Sequence[dict[str, Any]], name: str, arguments: Mapping[str, Any]
) -> tuple[int, dict[str, Any], list[str]] | None:
    """(model responses up to the one that made the call, that message, the matching ids)."""
    responses = [i for i, m in enumerate(messages) if m.get("role") == "assistant"]
    for index in reversed(responses):
        message = messages[index]
        calls = message.get("tool_calls") or []
        if not calls:
            continue
        ids = [
            str(c.get("id"))
            for c in calls
            if (c.get("function") or {}).get("name") == name
            and _arguments((c.get("function") or {}).get("arguments")) == dict(arguments)
            and c.get("id")
        ]
        return (responses.index(index) + 1, message, ids) if ids else None
    return None


def _before_tool_call(context: ToolCallHookContext) -> bool | None:
    """Name the call a dex tool is about to run (CrewAI's hook sees the executor; the tool
    does not)."""
    _CURRENT.set(None)
    bridge = _bridge_of(context.agent)
    if bridge is None:
        return None
    executor = _EXECUTORS.of(context.agent)
    messages = _executor_messages(executor)
    found = _find_call(messages, context.tool_name, context.tool_input)
    if found is None:
        return None
    responses, message, ids = found
    call_id = _CLAIMS.take(executor, message, ids)
    _CURRENT.set(
        CrewCall(
            context.tool_name,
            bridge.session_of(context),
            f"{run_id(context)}.{turn_id(responses)}",
            call_id,
            tuple(seen_messages(messages)),
        )
    )
    return None


def run_id(context: HookContext) -> str:
    """The run (one task conversation) a hook's call belongs to: `run-<12 hex digits>` of
    CrewAI's kickoff id and the task's id, of the flow's id for an agent in a flow, or of the
    agent's kickoff id (its own id before its first kickoff)."""
    crew, task = context.crew, context.task
    if crew is not None:
        parts = ["crew", _kickoff_of(crew), str(task.id) if task is not None else ""]
    elif flow := current_flow_id.get():
        parts = ["flow", str(flow)]
    else:
        parts = ["agent", _kickoff_of(context.agent)]
    return "run-" + hashlib.sha256("\0".join(parts).encode()).hexdigest()[:12]


def _kickoff_of(runner: Any) -> str:
    """CrewAI's id of the current kickoff of a crew or an agent (kept in its checkpoint and
    restored with it; CrewAI holds it privately), else the object's own id."""
    kickoff = getattr(runner, "_kickoff_event_id", None)
    return str(kickoff) if kickoff else str(getattr(runner, "id", ""))


def _before_llm_call(context: LLMCallHookContext) -> bool | None:
    """One conversation (S12.1): copy the task's conversation into the dex session, and hand
    the model the session's user messages written through dex that this run took and its
    conversation does not hold yet."""
    bridge = _bridge_of(context.agent)
    if bridge is None:
        return None
    if context.executor is not None:
        _EXECUTORS.saw(context.agent, context.executor)
    session = bridge.session_of(context)
    seen = seen_messages(context.messages)
    bridge.conversation.record(session, seen)
    texts = [m.text for m in seen if m.role is MessageRole.USER]
    for message in bridge.conversation.taken(session, run_id(context), texts):
        context.messages.append({"role": "user", "content": message.text or ""})
    return None


def seen_messages(messages: Sequence[Any]) -> list[SeenMessage]:
    """The user messages and the model's text of a CrewAI executor's messages, in order (the
    system prompt, tool calls and tool results are not the conversation)."""
    seen = []
    for message in messages:
        role = message.get("role") if isinstance(message, Mapping) else None
        content = message.get("content") if isinstance(message, Mapping) else None
        if role not in ("user", "assistant") or not isinstance(content, str) or not content:
            continue
        seen.append(
            SeenMessage(MessageRole.USER if role == "user" else MessageRole.ASSISTANT, content)
        )
    return seen


# --- the tools ----------------------------------------------------------------------------------


class _Bridge(FrameworkBridge[HookContext]):
    framework = "CrewAI"
    default_approver = DEFAULT_APPROVER

    def __init__(
        self,
        source: RuntimeSource,
        session_id: SessionIdSource | None,
        options: AdapterOptions,
        decide: Decide | None,
    ) -> None:
        super().__init__(source, session_id, options)
        self.decide = decide

    def session_of(self, context: HookContext) -> str:
        return self.session(context, lambda: _own_session(context))

    def run(self, tool: Tool, call: CrewCall, arguments: dict[str, Any]) -> str:
        named = FrameworkCall(call.session, call.turn, call.call_id, tool, arguments, call.history)

        def ask(record: ToolCallRecord) -> Decision | None:
            """`decide`'s answer, or none: the call waits for a person deciding in dex."""
            if self.decide is None:
                return None
            return Decision.parse(self.decide(self.shown(named, record)))

        return self.call(named, ask)


def _own_session(context: HookContext) -> str:
    """The session without `session_id`: `<crew id>.<task id>`, the flow's id, or the agent's."""
    crew, task = context.crew, context.task
    if crew is not None and task is not None:
        return f"{crew.id}.{task.id}"
    flow = current_flow_id.get()
    if flow:
        return str(flow)
    return str(getattr(context.agent, "id", "crewai"))


class _Arguments(BaseModel):
    """Any arguments: dex checks them against the tool's schema when the call is requested."""

    model_config = ConfigDict(extra="allow")


def _arguments_model(tool: Tool) -> type[BaseModel]:
    """A model CrewAI shows the LLM as the tool's schema: the dex tool's own JSON Schema."""
    schema = arguments_schema(tool)

    class Arguments(_Arguments):
        @classmethod
        def model_json_schema(cls, *args: Any, **kwargs: Any) -> dict[str, Any]:
            return dict(schema)

    Arguments.__name__ = f"{tool.name}_arguments"
    return Arguments


def _never_cache(_arguments: Any = None, _result: Any = None) -> bool:
    """CrewAI's tool cache would answer a repeated call from memory: every dex call is its own
    record, so nothing is cached."""
    return False


class DexCrewTool(BaseTool):
    """One dex tool as a CrewAI tool (built by `dex_crewai_tools`)."""

    _tool: Tool = PrivateAttr()
    _bridge: _Bridge = PrivateAttr()

    @classmethod
    def of(cls, tool: Tool, bridge: _Bridge) -> DexCrewTool:
        made = cls(
            name=tool.name,
            description=tool.description or tool.name,
            args_schema=_arguments_model(tool),
            cache_function=_never_cache,
        )
        made._tool = tool
        made._bridge = bridge
        return made

    @property
    def bridge(self) -> _Bridge | None:
        """The dex side of the tool (None for a tool CrewAI restored from a checkpoint)."""
        bridge: _Bridge | None = getattr(self, "_bridge", None)
        return bridge

    def _run(self, *args: Any, **kwargs: Any) -> str:
        call = _CURRENT.get()
        _CURRENT.set(None)
        bridge: _Bridge | None = getattr(self, "_bridge", None)
        if bridge is None:
            return NO_BRIDGE_TEXT.format(tool=self.name)
        if call is None or call.tool != self.name:
            return NO_CALL_ID_TEXT.format(tool=self.name)
        return bridge.run(self._tool, call, dict(kwargs))
