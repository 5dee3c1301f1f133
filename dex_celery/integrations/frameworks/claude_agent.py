"""dex tools for the Claude Agent SDK: a Claude agent's tool calls run on Celery workers.

    from dex_celery.integrations.frameworks.claude_agent import DexClaude

    dex_claude = DexClaude(dex, ["lookup", "refund"], ask=ask_a_person)
    async with ClaudeSDKClient(dex_claude.options(cwd=...)) as client:
        await client.query("Refund order 1002.")

The SDK runs the `claude` CLI; its users offer their own tools as an in-process SDK MCP server
(`ClaudeAgentOptions(mcp_servers={...})`) and decide on tool calls in its permission flow (a
`PreToolUse` hook, the `can_use_tool` callback). `DexClaude` is those three pieces:

- `server`: an SDK MCP server (named `dex`) whose tools are the dex tools; the model sees them
  as `mcp__dex__<tool>` (`model_tool_name`). Each call is requested through the ledger (S2, S3)
  and waited for; the model reads exactly the record's TOOL message (S4.4) as the tool result
  (never flagged an error, so the CLI adds nothing to it): the result, `Error: ...`, the
  rejection, or `OUTCOME_UNKNOWN_TOOL_RESULT` (S4.5);
- `hooks`: `PreToolUse` requests the call in dex when the model makes it, before any
  permission is asked, so a call a person must approve (S1.3) is visible with its deadline in
  `dex-celery approvals` while the person decides; it answers `ask` for such a call (so the
  SDK's `can_use_tool` is asked, whatever the allow rules say) and `allow` for one dex's policy
  lets run. `UserPromptSubmit` copies the conversation into dex and hands the model the
  session's messages written through dex (see "One conversation" below);
- `can_use_tool`: for a dex call waiting for a person it asks `ask` (the SDK's own
  `can_use_tool` signature, your person-facing callback): `PermissionResultAllow()` approves in
  dex (approver `approver`, `claude-agent-sdk` by default) and the call runs once;
  `PermissionResultDeny(message)` records it `rejected` by `approver` with the message as the
  reason, and the model reads the record's rejection text. `ask` may also answer `True` /
  `False` or `{"approved": bool, "decided_by": str, "reason": str}` to name who decided. An
  allow with `updated_input` other than the arguments asked for is refused
  (`CHANGED_ARGUMENTS_REASON`). Without `ask` the model reads that the call waits for a person
  and has not run; the person decides in dex. Other tools go to `ask` (denied without one).

The idempotency key (S2.1):

- session id: the SDK's session id (the CLI's, kept by `resume=`), unless `session_id` is given
  (a string, or a function of the SDK's session id);
- turn id: `turn-<n>`, the count of the model's responses (distinct assistant message ids) in
  the session's transcript up to and including the one that made the call
  (`calls.turn_id`). The transcript is what the CLI resumes a session from, so the
  count survives a new process;
- tool-call id: the `tool_use` block's id (the CLI passes it to an SDK MCP server's tool call
  in `_meta["claudecode/toolUseId"]`, and to the hooks as `tool_use_id`).

One conversation (S12.1): a session's user messages written through dex (reconcile reports
first of all) are handed to the model as the `additionalContext` of the `UserPromptSubmit` hook
of the session's next prompt: the CLI adds it to that model request right after the prompt and
keeps it in the session's transcript (a `hook_additional_context` entry), so the model reads it
once, before its reply, and a resumed session still holds it. Whether a message was delivered
is read from the transcript, as for every framework: one the transcript does not hold (a run
that crashed before it was written) is handed again, one it holds never is.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, Unpack, cast

from claude_agent_sdk import (
    ClaudeAgentOptions,
    HookContext,
    HookMatcher,
    McpSdkServerConfig,
    PermissionResultAllow,
    PermissionResultDeny,
    ToolPermissionContext,
)
from claude_agent_sdk.types import (
    HookEvent,
    HookInput,
    HookJSONOutput,
    PermissionResult,
    PreToolUseHookSpecificOutput,
    UserPromptSubmitHookSpecificOutput,
)
from mcp import types as mcp_types
from mcp.server import Server

from dex_celery.client.dex_client import AsyncDexClient, DexClient
from dex_celery.engine import RuntimeSource
from dex_celery.integrations.frameworks.calls import (
    AdapterOptions,
    Decision,
    FrameworkBridge,
    FrameworkCall,
    record_text,
    runtime_source,
    same_arguments,
    select_tools,
    shown_request,
    turn_id,
)
from dex_celery.model.conversation import SeenMessage
from dex_celery.model.outcomes import CallStatus
from dex_celery.model.records import MessageRole, ToolCallRecord
from dex_celery.tools.signature_schema import arguments_schema
from dex_celery.tools.tool import Tool

log = logging.getLogger(__name__)

#: Who decided, in dex's record, when the answer does not say.
DEFAULT_APPROVER = "claude-agent-sdk"
#: The SDK MCP server's name: the model sees a dex tool as `mcp__dex__<tool>`.
SERVER_NAME = "dex"
#: Where the CLI puts a tool call's `tool_use` id in an MCP tool call's `_meta`.
TOOL_USE_ID_META = "claudecode/toolUseId"
#: How long (seconds) `PreToolUse` waits for the CLI to write the call's model response into
#: the transcript (it writes it asynchronously, some milliseconds after the hook is asked).
TRANSCRIPT_WAIT = 10.0
#: How the messages handed to the model in one `additionalContext` are joined.
CONTEXT_SEPARATOR = "\n\n"

SessionIdSource = str | Callable[[str], str]
#: A person's decision on a dex call: the SDK's `can_use_tool` signature; it may answer with the
#: SDK's results or a dex decision (`True` / `False`, `{"approved", "decided_by", "reason"}`).
Ask = Callable[
    [str, dict[str, Any], ToolPermissionContext],
    Awaitable[PermissionResult | bool | Mapping[str, Any]],
]


def model_tool_name(tool: str, server: str = SERVER_NAME) -> str:
    """The name the model calls a dex tool by (`mcp__<server>__<tool>`)."""
    return f"mcp__{server}__{tool}"


@dataclass(frozen=True, slots=True)
class _Call:
    """A call the model made, as the `PreToolUse` hook requested it."""

    session: str
    turn: str
    tool: Tool
    arguments: dict[str, Any]
    record: ToolCallRecord | str


class DexClaude(FrameworkBridge[str]):
    """The dex tools, hooks and permission callback for a Claude agent (see the module)."""

    framework = "Claude Agent SDK"
    default_approver = DEFAULT_APPROVER

    def __init__(
        self,
        dex: RuntimeSource | DexClient | AsyncDexClient,
        names: Sequence[str] | None = None,
        *,
        session_id: SessionIdSource | None = None,
        ask: Ask | None = None,
        server_name: str = SERVER_NAME,
        **options: Unpack[AdapterOptions],
    ) -> None:
        source = runtime_source(dex)
        super().__init__(source, session_id, options)
        self.tools = {tool.name: tool for tool in select_tools(source, names)}
        self.ask = ask
        self.server_name = server_name
        #: The calls the hook requested, by `tool_use` id, until their tool runs.
        self._calls: dict[str, _Call] = {}
        self.server = McpSdkServerConfig(type="sdk", name=server_name, instance=self._mcp())

    # --- what to give the SDK -------------------------------------------------------------------

    def tool_names(self) -> list[str]:
        """The names the model calls the dex tools by."""
        return [model_tool_name(name, self.server_name) for name in self.tools]

    @property
    def hooks(self) -> dict[HookEvent, list[HookMatcher]]:
        return {
            "PreToolUse": [HookMatcher(hooks=[self._pre_tool_use])],
            "UserPromptSubmit": [HookMatcher(hooks=[self._user_prompt_submit])],
        }

    def options(self, **kwargs: Any) -> ClaudeAgentOptions:
        """`ClaudeAgentOptions(**kwargs)` with the dex server, hooks and `can_use_tool` added
        (beside any `mcp_servers` and `hooks` of your own)."""
        servers = {**dict(kwargs.pop("mcp_servers", None) or {}), self.server_name: self.server}
        hooks: dict[HookEvent, list[HookMatcher]] = dict(kwargs.pop("hooks", None) or {})
        for event, matchers in self.hooks.items():
            hooks[event] = [*matchers, *hooks.get(event, [])]
        return ClaudeAgentOptions(
            mcp_servers=servers, hooks=cast(Any, hooks), can_use_tool=self.can_use_tool, **kwargs
        )

    async def approval_request(self, tool_use_id: str) -> dict[str, Any] | None:
        """What to show the person asked about the call `tool_use_id` (`context.tool_use_id`
        in `can_use_tool`): `{"dex_key", "tool", "arguments", "approval_deadline", "preview"}`,
        secrets `***`; None for a call that is not a dex call waiting for a person."""
        call = self._calls.get(tool_use_id)
        if call is None or not isinstance(call.record, ToolCallRecord):
            return None
        request = shown_request(call.record, call.tool, call.arguments)
        request["preview"] = await self.decisions.apreview(call.record)
        return request

    # --- ids ----------------------------------------------------------------------------------

    def _session(self, sdk_session: str) -> str:
        return self.session(sdk_session, lambda: sdk_session)

    def _dex_tool(self, model_name: str) -> Tool | None:
        prefix = model_tool_name("", self.server_name)
        if not model_name.startswith(prefix):
            return None
        return self.tools.get(model_name[len(prefix) :])

    # --- the permission flow ----------------------------------------------------------------

    async def _pre_tool_use(
        self, data: HookInput, tool_use_id: str | None, context: HookContext
    ) -> HookJSONOutput:
        hook = cast(Mapping[str, Any], data)
        tool = self._dex_tool(str(hook.get("tool_name", "")))
        if tool is None or not tool_use_id:
            return {}
        session = self._session(str(hook.get("session_id", "")))
        entries = await _transcript(hook.get("transcript_path"), tool_use_id)
        turn = turn_id(model_responses(entries, tool_use_id))
        arguments = dict(hook.get("tool_input") or {})
        call = FrameworkCall(session, turn, tool_use_id, tool, arguments, seen_entries(entries))
        record = await self.arequest(call)
        self._calls[tool_use_id] = _Call(session, turn, tool, arguments, record)
        waiting = isinstance(record, ToolCallRecord) and (
            record.status is CallStatus.AWAITING_APPROVAL
        )
        decision: Literal["ask", "allow"] = "ask" if waiting else "allow"
        reason = (
            f"dex-celery: {tool.name} waits for a person's approval ({record.key})"
            if isinstance(record, ToolCallRecord) and waiting
            else "dex-celery: the call's policy lets it run"
        )
        output: PreToolUseHookSpecificOutput = {
            "hookEventName": "PreToolUse",
            "permissionDecision": decision,
            "permissionDecisionReason": reason,
        }
        return {"hookSpecificOutput": output}

    async def can_use_tool(
        self, tool_name: str, tool_input: dict[str, Any], context: ToolPermissionContext
    ) -> PermissionResult:
        """The SDK's `can_use_tool`: a dex call waiting for a person is decided by `ask` and
        the decision recorded in dex; any other tool goes to `ask` as it is."""
        call = self._calls.get(context.tool_use_id or "")
        if call is None or self._dex_tool(tool_name) is None:
            if self.ask is None:
                return PermissionResultDeny(message=f"{tool_name} is not permitted here")
            return _as_permission(await self.ask(tool_name, tool_input, context))
        record = call.record
        if not isinstance(record, ToolCallRecord):
            return PermissionResultAllow()
        record = await self.decisions.aclient.get_call(record.key)
        if record.status is not CallStatus.AWAITING_APPROVAL or self.ask is None:
            return PermissionResultAllow()  # decided in dex meanwhile, or decided there later
        decision = _as_decision(await self.ask(tool_name, tool_input, context), call.arguments)
        record = await self.arecord_decision(record, decision)
        if record.finished:
            return PermissionResultDeny(message=record_text(record))
        return PermissionResultAllow()

    # --- the tools ----------------------------------------------------------------------------

    def _mcp(self) -> Server[Any]:
        tools = [
            mcp_types.Tool(
                name=tool.name,
                description=tool.description or tool.name,
                input_schema=arguments_schema(tool),
            )
            for tool in self.tools.values()
        ]

        async def list_tools(ctx: Any, params: Any) -> mcp_types.ListToolsResult:
            return mcp_types.ListToolsResult(tools=tools)

        async def call_tool(
            ctx: Any, params: mcp_types.CallToolRequestParams
        ) -> mcp_types.CallToolResult:
            text = await self._run(params.name, dict(params.meta or {}))
            return mcp_types.CallToolResult(
                content=[mcp_types.TextContent(type="text", text=text)], is_error=False
            )

        return Server(self.server_name, on_list_tools=list_tools, on_call_tool=call_tool)

    async def _run(self, name: str, meta: Mapping[str, Any]) -> str:
        """What the model reads for the call: the record's TOOL message, once it ended."""
        tool_use_id = str(meta.get(TOOL_USE_ID_META) or "")
        call = self._calls.pop(tool_use_id, None)
        if call is None or call.tool.name != name:
            return (
                f"Error: dex-celery could not tell which tool call this is ({name}, "
                f"{tool_use_id or 'no tool_use id'}): the agent's options lack the dex hooks "
                "(use DexClaude.options). Nothing was run."
            )
        if not isinstance(call.record, ToolCallRecord):
            return call.record
        return await self.atext(await self.decisions.aclient.get_call(call.record.key))

    # --- one conversation (S12.1) -----------------------------------------------------------

    async def _user_prompt_submit(
        self, data: HookInput, tool_use_id: str | None, context: HookContext
    ) -> HookJSONOutput:
        hook = cast(Mapping[str, Any], data)
        session = self._session(str(hook.get("session_id", "")))
        entries = await asyncio.to_thread(read_transcript, hook.get("transcript_path"))
        await self.conversation.arecord(session, seen_entries(entries))
        held = held_texts(entries)
        pending = await self.conversation.aundelivered(session, held)
        if not pending:
            return {}
        output: UserPromptSubmitHookSpecificOutput = {
            "hookEventName": "UserPromptSubmit",
            "additionalContext": CONTEXT_SEPARATOR.join(m.text or "" for m in pending),
        }
        return {"hookSpecificOutput": output}


def _as_permission(answer: PermissionResult | bool | Mapping[str, Any]) -> PermissionResult:
    if isinstance(answer, PermissionResultAllow | PermissionResultDeny):
        return answer
    decision = Decision.parse(answer)
    if decision.approved:
        return PermissionResultAllow()
    return PermissionResultDeny(message=decision.reason or "denied")


def _as_decision(
    answer: PermissionResult | bool | Mapping[str, Any], asked: Mapping[str, Any]
) -> Decision:
    """A person's answer as a dex `Decision` (`InvalidDecision` for another shape)."""
    if isinstance(answer, PermissionResultAllow):
        changed = answer.updated_input is not None and not same_arguments(
            asked, answer.updated_input
        )
        return Decision(not changed, None, None, edited=changed)
    if isinstance(answer, PermissionResultDeny):
        return Decision(False, None, answer.message or None)
    return Decision.parse(answer)


# --- the transcript -------------------------------------------------------------------------------


def read_transcript(path: Any) -> list[dict[str, Any]]:
    """The entries of a session's transcript (the CLI's JSONL file), main chain only; none when
    there is no file yet."""
    if not path:
        return []
    try:
        lines = Path(str(path)).read_text(encoding="utf-8").splitlines()
    except FileNotFoundError:
        return []
    entries = []
    for line in lines:
        try:
            entry = json.loads(line)
        except ValueError:  # a line being written
            continue
        if isinstance(entry, dict) and not entry.get("isSidechain"):
            entries.append(entry)
    return entries


async def _transcript(path: Any, tool_use_id: str) -> list[dict[str, Any]]:
    """The transcript once it holds the model response that made `tool_use_id` (polled up to
    `TRANSCRIPT_WAIT`; after that, as it is, and the count takes that response as the next)."""
    deadline = time.monotonic() + TRANSCRIPT_WAIT
    while True:
        entries = await asyncio.to_thread(read_transcript, path)
        if any(tool_use_id in _tool_use_ids(e) for e in entries) or not path:
            return entries
        if time.monotonic() >= deadline:
            log.warning("the transcript %s does not hold the tool call %s", path, tool_use_id)
            return entries
        await asyncio.sleep(0.02)


def _assistant_id(entry: Mapping[str, Any]) -> str | None:
    if entry.get("type") != "assistant":
        return None
    message = entry.get("message") or {}
    return str(message.get("id") or entry.get("uuid") or "")


def _tool_use_ids(entry: Mapping[str, Any]) -> set[str]:
    if entry.get("type") != "assistant":
        return set()
    content = (entry.get("message") or {}).get("content") or []
    return {
        str(block.get("id"))
        for block in content
        if isinstance(block, dict) and block.get("type") == "tool_use"
    }


def model_responses(entries: Sequence[Mapping[str, Any]], tool_use_id: str) -> int:
    """Model responses up to and including the one that made `tool_use_id`: the CLI writes one
    response as several entries with one message id. Without that response in the transcript,
    it is the one after all those written."""
    seen: list[str] = []
    for entry in entries:
        message_id = _assistant_id(entry)
        if message_id is None:
            continue
        if message_id not in seen:
            seen.append(message_id)
        if tool_use_id in _tool_use_ids(entry):
            return len(seen)
    return len(seen) + 1


def seen_entries(entries: Sequence[Mapping[str, Any]]) -> list[SeenMessage]:
    """The user prompts and the model's text, in transcript order (what is copied into dex;
    the messages a hook handed the model are dex's own already)."""
    seen = []
    for entry in entries:
        kind = entry.get("type")
        if kind not in ("user", "assistant") or entry.get("isMeta"):
            continue
        text = _text((entry.get("message") or {}).get("content"))
        if text:
            role = MessageRole.USER if kind == "user" else MessageRole.ASSISTANT
            seen.append(SeenMessage(role, text))
    return seen


def held_texts(entries: Sequence[Mapping[str, Any]]) -> list[str]:
    """The user texts the session's transcript holds: its prompts, and the messages handed to
    the model by a `UserPromptSubmit` hook (each part of an `additionalContext`, and the whole,
    so a message whose own text holds the separator still counts as held)."""
    texts = [m.text for m in seen_entries(entries) if m.role is MessageRole.USER]
    for entry in entries:
        attachment = entry.get("attachment") if entry.get("type") == "attachment" else None
        if not isinstance(attachment, dict):
            continue
        if attachment.get("type") != "hook_additional_context":
            continue
        for context in attachment.get("content") or []:
            parts = str(context).split(CONTEXT_SEPARATOR)
            texts.extend([str(context)] if len(parts) == 1 else [str(context), *parts])
    return texts


def _text(content: Any) -> str:
    if isinstance(content, str):
        return "" if content.startswith("<") and "</" in content else content
    if not isinstance(content, list):
        return ""
    return "".join(
        str(block.get("text", ""))
        for block in content
        if isinstance(block, dict)
        and block.get("type") == "text"
        and not str(block.get("text", "")).startswith("<system-reminder>")
    )
