"""dex tools as an MCP server: `dex-celery mcp` (stdio or streamable HTTP).

Every `tools/call` is requested through the ledger like any other call (S2, S3): approval,
retries and outcome rules apply, and the answer is the text of the call's record, the same text
the session history keeps (S4.4). A call that waits for a person answers at once with that fact
and its idempotency key; calling again with the same ids after the decision returns the record
(S2.3: the same ids are one call, nothing runs twice).

Which call a `tools/call` is: the ids travel in the request's `_meta`, either the whole key
under `IDEMPOTENCY_META_KEY` (`"session/turn/call"`, the key dex-celery's own MCP client sends) or
the three ids under `SESSION_META_KEY`, `TURN_META_KEY` and `TOOL_CALL_META_KEY`. A request
without ids is a new call in the server's session (`--session`), and its answer names its key;
while that call's outcome has not been given (it waits for approval, or is still in flight),
the same tool with the same arguments and no ids is that call again, so a plain MCP client gets
the outcome by asking again after the decision. Once answered, the next such request is a new
call.

Every answer carries the outcome field of `mcp/outcome` (did the tool run, may it have) beside
the key. A client of the 2026-07-28 revision that declares the tasks extension gets, for a call
that cannot finish at once, a task whose id is the call's key (`mcp/tasks`); other clients get
the answers above. docs/mcp.md says all of it for clients.

Tool annotations are derived from each tool's effect class (`annotations_for`).

Who may call (S11.3): over HTTP the door of `mcp/http` checks the `Host`, authenticates the
caller (the web app's `web_users` / `web_tokens`, scope `tools:call`) and refuses a bind beyond
loopback without credentials. A call key is not a capability: a caller may request or follow
calls only of sessions its identity owns (`store/owners.py`); naming another identity's session
(or one begun in-process) is refused with the same answer whether or not it exists, and runs
nothing. An authenticated caller's session ids live in its own namespace (`mcp/namespace`), so
no caller can take the session another will use by naming it first; calls without ids go to
`--session` in the caller's namespace (the local caller's: `--session` itself).
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import logging
import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import anyio
import mcp_types
import redis
from mcp.server import Server
from mcp.server.caching import CacheHint
from mcp.server.context import ServerRequestContext
from mcp.server.stdio import stdio_server

from dex_celery.access import Credentials, HostAllowlist, Identity, check_bind, local_identity
from dex_celery.client.dex_client import AsyncDexClient
from dex_celery.errors import CallTimeout, DexError, InvalidId, RequestInFlight
from dex_celery.integrations.conversation import Conversation
from dex_celery.integrations.mcp.http import IDENTITY_SCOPE_KEY, SDK_TRANSPORT_SECURITY, guarded
from dex_celery.integrations.mcp.messages import SessionMessages
from dex_celery.integrations.mcp.namespace import NAMESPACE_END, namespace_of, scoped_session
from dex_celery.integrations.mcp.outcome import (
    OUTCOME_EXTENSION,
    OUTCOME_META_KEY,
    STATUS_META_KEY,
    Outcome,
    extension_settings,
    outcome_of,
)
from dex_celery.integrations.mcp.tasks import (
    ListenParams,
    TaskMethods,
    TaskParams,
    TaskStatusPush,
    UpdateParams,
    created,
    speaks_tasks,
)
from dex_celery.integrations.mcp.unanswered import UnansweredCalls
from dex_celery.integrations.mcp.wire import IDEMPOTENCY_META_KEY, TASKS_EXTENSION
from dex_celery.model.effects import UNDECLARED_EFFECT, EffectClass
from dex_celery.model.ids import KEY_SEPARATOR, MAX_ID_LENGTH, CallKey, validate_id
from dex_celery.model.outcomes import CallStatus, tool_output
from dex_celery.model.policy import approval_by_default
from dex_celery.model.records import ToolCallRecord
from dex_celery.store.owners import SessionOwners
from dex_celery.tools.call_identity import identify
from dex_celery.tools.catalog import ToolCatalog
from dex_celery.tools.definitions import mcp_hints
from dex_celery.tools.redact import record_arguments
from dex_celery.tools.signature_schema import arguments_schema
from dex_celery.tools.tool import Tool, find_tool

if TYPE_CHECKING:
    from dex_celery.engine import RuntimeSource

log = logging.getLogger("dex_celery.mcp")

#: `_meta` keys a caller may use instead of the whole key (all three together).
SESSION_META_KEY = "dex-celery/session-id"
TURN_META_KEY = "dex-celery/turn-id"
TOOL_CALL_META_KEY = "dex-celery/tool-call-id"
#: `_meta` keys of listed tools: the effect class and whether calls wait for approval. Every
#: answer carries `STATUS_META_KEY`, `OUTCOME_META_KEY` (`mcp/outcome`) and the call's key.
EFFECT_META_KEY = "dex-celery/effect"
APPROVAL_META_KEY = "dex-celery/requires-approval"

#: How long a 2026-07-28 client may keep the tool list (`ttlMs`): lists change only when the
#: deployment registers tools or refreshes an MCP server's list; per caller (`private`).
TOOLS_LIST_TTL_MS = 60_000

#: The turn id of calls that arrive without ids.
ANONYMOUS_TURN = "mcp"
#: The turn id of calls named by an opaque idempotency key (one without `/`), as a client of the
#: outcome extension may send (docs/mcp-outcome-extension.md).
OPAQUE_KEY_TURN = "key"
#: Answers that do not give the outcome yet.
_UNANSWERED = frozenset({CallStatus.AWAITING_APPROVAL.value, CallStatus.PENDING.value})


def declared_effect(tool: Tool) -> EffectClass:
    """The class a call of `tool` gets without a session default: its policy, then its metadata."""
    return tool.declared_effect or UNDECLARED_EFFECT


def annotations_for(tool: Tool) -> mcp_types.ToolAnnotations | None:
    """MCP hints from the tool's effect class (its row of the one table, `model/effects.py`)."""
    hints = mcp_hints(tool)
    return mcp_types.ToolAnnotations.model_validate(hints) if hints else None


def mcp_tool(tool: Tool) -> mcp_types.Tool:
    effect = declared_effect(tool)
    approval = (
        approval_by_default(effect, tool.annotations)
        if tool.policy.requires_approval is None
        else tool.policy.requires_approval
    )
    return mcp_types.Tool(
        name=tool.name,
        description=tool.description or None,
        input_schema=arguments_schema(tool),
        annotations=annotations_for(tool),
        _meta={EFFECT_META_KEY: effect.value, APPROVAL_META_KEY: approval},
    )


@dataclass(frozen=True, slots=True)
class CallIds:
    session_id: str
    turn_id: str
    tool_call_id: str

    @property
    def key(self) -> str:
        return CallKey.of(self.session_id, self.turn_id, self.tool_call_id).key


def has_ids(meta: Mapping[str, Any] | None) -> bool:
    keys = (IDEMPOTENCY_META_KEY, SESSION_META_KEY, TURN_META_KEY, TOOL_CALL_META_KEY)
    return any(k in (meta or {}) for k in keys)


def call_ids(
    meta: Mapping[str, Any] | None, default_session: str, unanswered: str | None = None
) -> CallIds:
    """The call's ids from the request's `_meta`. Without ids: the call `unanswered` (the key of
    an earlier request of the same tool and arguments whose outcome was not given yet), else new
    ids."""
    meta = meta or {}
    key = meta.get(IDEMPOTENCY_META_KEY)
    if key is not None:
        if not isinstance(key, str):
            raise InvalidId(f"_meta {IDEMPOTENCY_META_KEY!r} must be a string 'session/turn/call'")
        if KEY_SEPARATOR not in key:
            return opaque_call(key, default_session)
        parsed = CallKey.parse(key)
        return CallIds(parsed.session_id, parsed.turn_id, parsed.tool_call_id)
    given = [meta.get(k) for k in (SESSION_META_KEY, TURN_META_KEY, TOOL_CALL_META_KEY)]
    if any(v is not None for v in given):
        if not all(isinstance(v, str) for v in given):
            raise InvalidId(
                f"give all of _meta {SESSION_META_KEY!r}, {TURN_META_KEY!r} and "
                f"{TOOL_CALL_META_KEY!r} as strings, or {IDEMPOTENCY_META_KEY!r}"
            )
        session, turn, call = (str(v) for v in given)
        return CallIds(session, turn, call)
    if unanswered is not None:
        parsed = CallKey.parse(unanswered)
        return CallIds(parsed.session_id, parsed.turn_id, parsed.tool_call_id)
    return CallIds(default_session, ANONYMOUS_TURN, uuid.uuid4().hex)


def opaque_call(key: str, session_id: str) -> CallIds:
    """The call an opaque idempotency key names: one call per key in the caller's default
    session (the key's digest is its id, so any text of up to `MAX_ID_LENGTH` characters will
    do). The answers carry the call's full key, which names the same call when sent again."""
    if not key or len(key) > MAX_ID_LENGTH or not key.isprintable():
        raise InvalidId(
            f"_meta {IDEMPOTENCY_META_KEY!r} must be 1 to {MAX_ID_LENGTH} printable characters"
        )
    digest = hashlib.sha256(key.encode()).hexdigest()[:32]
    return CallIds(session_id, OPAQUE_KEY_TURN, digest)


def _canonical(arguments: Mapping[str, Any]) -> str:
    return json.dumps(arguments, sort_keys=True, separators=(",", ":"), default=str)


def _text_result(
    text: str, *, error: bool, key: str | None, status: str, outcome: Outcome
) -> mcp_types.CallToolResult:
    meta: dict[str, Any] = {STATUS_META_KEY: status, OUTCOME_META_KEY: outcome.value}
    if key is not None:
        meta[IDEMPOTENCY_META_KEY] = key
    return mcp_types.CallToolResult(
        content=[mcp_types.TextContent(type="text", text=text)], is_error=error, _meta=meta
    )


def awaiting_approval_text(record: ToolCallRecord) -> str:
    """What the model reads of a call that waits for a person: the call as the approver sees it
    (its arguments by the one display rule, `shown_arguments`), and how to get its outcome."""
    arguments = json.dumps(record_arguments(record), sort_keys=True, ensure_ascii=False)
    return (
        f"The call {record.key} of {record.tool_name} with arguments {arguments} is waiting for "
        "a person's approval and has not run. Once it is "
        f"decided, call the tool again with _meta {_meta_json(record.key)} to get its outcome; "
        "asking again never runs it twice."
    )


def still_running_text(record: ToolCallRecord, waited: float) -> str:
    return (
        f"The call {record.key} is still in flight after {waited:g}s. Call the tool again with "
        f"_meta {_meta_json(record.key)} to keep waiting for its outcome."
    )


def _meta_json(key: str) -> str:
    """The `_meta` to send again, as JSON (what a client copies into its request)."""
    return json.dumps({IDEMPOTENCY_META_KEY: key})


def not_yours_text(session_id: str) -> str:
    """The answer for a session the caller does not own: the same whether or not it exists."""
    return (
        f"error: the session {session_id!r} is not one of yours: a caller may request or follow "
        "only calls of sessions it began through this server; nothing was recorded or run"
    )


def own_session(identity: Identity) -> str:
    """The session of calls without ids when `--session` is not given: `mcp-<user>`, the same
    for every server process of that user, so a request re-sent to a new process (a stdio
    client that starts one per request, or restarts it after a broken pipe) is the same call
    while its outcome has not been given (docs/mcp.md)."""
    mine = f"mcp-{identity.name}"
    try:
        return validate_id("session id", mine)
    except InvalidId:
        return f"mcp-{hashlib.sha256(identity.name.encode()).hexdigest()[:16]}"


def principal_of(identity: Identity) -> str:
    """The principal of write budgets kept per principal (S13.1): the identity's name, or a
    digest of it where the name could not be one part of a key."""
    try:
        return validate_id("principal", identity.name)
    except InvalidId:
        return f"id-{hashlib.sha256(identity.name.encode()).hexdigest()[:16]}"


class DexMcpServer:
    """The MCP server of one `Dex`: its tools, each call requested through the ledger."""

    def __init__(
        self,
        dex: RuntimeSource,
        *,
        session_id: str | None = None,
        wait_timeout: float = 300.0,
        task_after: float = 1.0,
    ):
        self.dex = dex
        self.client = AsyncDexClient(dex)
        #: Who calls over stdio (and over HTTP without credentials): the OS user.
        self.local = local_identity()
        self.session_id = session_id or own_session(self.local)
        validate_id("session id", self.session_id)
        self.wait_timeout = wait_timeout
        #: Seconds a queued or running call of a client speaking tasks is waited for before
        #: the answer is a task instead (a call waiting for a person is one at once).
        self.task_after = task_after
        self.owners = SessionOwners(dex.runtime.store, redis_url=dex.settings.redis_url)
        #: Calls without ids whose outcome was not given yet, by (caller, session, tool,
        #: arguments), in the ledger's Redis so every server process agrees (stdio clients may
        #: start one per request): asking the same again answers for that call.
        runtime = dex.runtime
        self.unanswered = UnansweredCalls(
            runtime.redis,
            prefix=runtime.keys.prefix,
            ttl=dex.settings.approval_timeout + wait_timeout,
            redis_url=dex.settings.redis_url,
        )
        self.server: Server[Any] = Server(
            "dex-celery",
            instructions=(
                "Tools run on Celery workers with recorded outcomes. An answer may say the call "
                "is waiting for approval or that its outcome is unknown: read it before acting."
            ),
            on_list_tools=self._list_tools,
            cache_hints={"tools/list": CacheHint(ttl_ms=TOOLS_LIST_TTL_MS, scope="private")},
        )
        # Registered directly: a `tools/call` may answer with a task (a plain dict), which the
        # typed `on_call_tool` hook does not admit.
        self.server.add_request_handler(
            "tools/call", mcp_types.CallToolRequestParams, self._call_tool
        )
        self.tasks = TaskMethods(
            self.client,
            self.owners,
            self.unanswered,
            identity_of=self.identity_of,
            result_of=self.final_result,
            where_is=self.where_is,
        )
        self.server.add_request_handler("tasks/get", TaskParams, self.tasks.get)
        self.server.add_request_handler("tasks/cancel", TaskParams, self.tasks.cancel)
        # Not in the SDK's method tables: served the way tasks/get and tasks/cancel are.
        self.server.add_request_handler("tasks/update", UpdateParams, self.tasks.update)
        # `notifications/tasks/status` over `subscriptions/listen` (`tasksStatus`): the SDK's
        # own listen handler knows the list-changed kinds only, so this one serves the method.
        push = TaskStatusPush(self.tasks, dex.runtime.events)
        self.server.add_request_handler("subscriptions/listen", ListenParams, push)
        self.server.extensions[TASKS_EXTENSION] = {}
        # The session's messages for the client's agent (reconcile reports): `mcp/messages`.
        self.messages = SessionMessages(
            Conversation(dex),
            self.owners,
            identity_of=self.identity_of,
            default_session=self.default_session,
        )
        self.server.add_request_handler(
            "prompts/list", mcp_types.PaginatedRequestParams, self.messages.list
        )
        self.server.add_request_handler(
            "prompts/get", mcp_types.GetPromptRequestParams, self.messages.get
        )
        # Every answer carries the outcome field; advertising it lets a client rely on it.
        self.server.extensions[OUTCOME_EXTENSION] = extension_settings()

    async def _list_tools(
        self, ctx: ServerRequestContext[Any], params: mcp_types.PaginatedRequestParams | None
    ) -> mcp_types.ListToolsResult:
        tools = self.dex.runtime.tools
        if isinstance(tools, ToolCatalog):
            # MCP servers' tools from their kept lists (fetched if never kept; a dead one left
            # out): runs the source's own event loop in a thread, off this one.
            for error in await asyncio.to_thread(tools.provide_all):
                log.warning("%s", error)
        return mcp_types.ListToolsResult(tools=[mcp_tool(t) for t in tools.values()])

    async def _call_tool(
        self, ctx: ServerRequestContext[Any], params: mcp_types.CallToolRequestParams
    ) -> mcp_types.CallToolResult | dict[str, Any]:
        arguments = params.arguments or {}
        identity = self.identity_of(ctx)
        session = self.default_session(identity)
        asked = ""
        try:
            unanswered = None
            if not has_ids(params.meta):
                asked = self.unanswered.key(
                    identity.name,
                    session,
                    params.name,
                    await asyncio.to_thread(self._same_call_text, params.name, arguments),
                )
                fresh = call_ids(None, session).key
                unanswered = await asyncio.to_thread(self.unanswered.claim, asked, fresh)
            ids = call_ids(params.meta, session, unanswered)
            scoped = scoped_session(identity, ids.session_id)
            if scoped is None or not await asyncio.to_thread(
                self.owners.claim, scoped, identity.name
            ):
                log.warning("refused %s a call of session %r", identity.name, ids.session_id)
                return _text_result(
                    not_yours_text(ids.session_id),
                    error=True,
                    key=None,
                    status="refused",
                    outcome=Outcome.NOT_EXECUTED,
                )
            # The authenticated identity is the principal of budgets kept per principal (S13.1).
            record = await self.client.request_call(
                scoped, ids.turn_id, ids.tool_call_id, params.name, arguments,
                principal=principal_of(identity),
            )  # fmt: skip
        except RequestInFlight as e:
            # Recorded (or maybe): asking again the same way must follow this call, not make a
            # second one, even for a client that sends no ids (S11.2).
            # The shared map already names this call for a request without ids.
            key = e.keys[0] if e.keys else None
            return _text_result(
                f"error: {e}", error=True, key=key, status="in_flight", outcome=Outcome.PENDING
            )
        except DexError as e:  # bad ids, unknown tool, bad arguments: nothing was recorded
            if unanswered is not None:
                with contextlib.suppress(DexError):
                    await asyncio.to_thread(self.unanswered.forget, asked, unanswered)
            return _text_result(
                f"error: {e}", error=True, key=None, status="refused", outcome=Outcome.NOT_EXECUTED
            )
        if speaks_tasks(ctx):
            task = await self.as_task(record)
            if task is not None:
                if unanswered is not None:
                    # `tasks/get` gives the outcome, so it is the one to forget the request.
                    with contextlib.suppress(DexError):
                        await asyncio.to_thread(self.unanswered.remember_task, record.key, asked)
                return task
        result = await self.answer(record)
        if unanswered is not None and (
            result.meta is None or result.meta[STATUS_META_KEY] not in _UNANSWERED
        ):
            # Its outcome was given: asking the same way again is a new call.
            with contextlib.suppress(DexError):
                await asyncio.to_thread(self.unanswered.forget, asked, record.key)
        return result

    def _same_call_text(self, tool_name: str, arguments: Mapping[str, Any]) -> str:
        """What makes two requests without ids the same call (S12.2): the tool's fingerprint of
        the arguments as it will receive them; the text as sent for a name or arguments the
        request will refuse anyway (nothing is recorded for those). May read an MCP server's
        tool list, so it runs off the event loop."""
        try:
            tool = find_tool(self.dex.runtime.tools, tool_name)
            return identify(tool, arguments, self.dex.settings.secret_key).fingerprint
        except DexError:
            return _canonical(arguments)

    def identity_of(self, ctx: ServerRequestContext[Any]) -> Identity:
        """The caller the HTTP door authenticated (`mcp/http`), or the local user (stdio)."""
        request = ctx.request
        scope = getattr(request, "scope", None)
        found = scope.get(IDENTITY_SCOPE_KEY) if isinstance(scope, dict) else None
        return found if isinstance(found, Identity) else self.local

    def default_session(self, identity: Identity) -> str:
        """Where calls without ids go: `--session` for the local caller, else that session in
        the caller's own namespace (`mcp/namespace`), so no other caller can take it first."""
        tag = namespace_of(identity)
        if tag is None:
            return self.session_id
        try:
            scoped = scoped_session(identity, self.session_id)
        except InvalidId:  # `--session` too long to prefix
            scoped = None
        if scoped is None:
            digest = hashlib.sha256(self.session_id.encode()).hexdigest()[:16]
            scoped = f"{tag}{NAMESPACE_END}{digest}"
        return scoped

    def where_is(self, key: str) -> str | None:
        """A call in flight as the ledger holds it: queued, or running on which worker (None
        if the ledger does not answer: the task then says less, never something wrong)."""
        try:
            entry = self.dex.runtime.ledger.read(key)
        except (redis.RedisError, DexError) as e:  # the task's other fields come from SQL
            log.info("tasks: the ledger did not say where %s is: %s", key, e)
            return None
        if entry is None or entry.status != "active":
            return None
        if entry.state == "running" and entry.owner:
            return f"running on {entry.owner} (attempt {entry.attempt})"
        if entry.state == "enqueued":
            return f"queued for a worker (attempt {entry.attempt})"
        return None

    async def as_task(self, record: ToolCallRecord) -> dict[str, Any] | None:
        """The task answering a client that speaks tasks, or None if the call ended within
        `task_after` seconds (then it gets the plain answer)."""
        if record.status is CallStatus.PENDING:
            with contextlib.suppress(CallTimeout):
                (record,) = await self.client.wait([record.key], timeout=self.task_after)
        if record.finished:
            return None
        return created(record, poll_interval=self.tasks.poll_interval)

    async def answer(self, record: ToolCallRecord) -> mcp_types.CallToolResult:
        """The record's text once the call has ended; at once if it waits for a person."""
        if record.status is CallStatus.AWAITING_APPROVAL:
            # Not a final result: `isError` is set unless the call succeeded (README), and
            # `_meta["dex-celery/status"]` says why.
            return _text_result(
                awaiting_approval_text(record),
                error=True,
                key=record.key,
                status=record.status,
                outcome=Outcome.PENDING,
            )
        if not record.finished:
            try:
                (record,) = await self.client.wait([record.key], timeout=self.wait_timeout)
            except CallTimeout:
                return _text_result(
                    still_running_text(record, self.wait_timeout),
                    error=True,
                    key=record.key,
                    status=record.status,
                    outcome=Outcome.PENDING,
                )
        return await self.final_result(record)

    async def final_result(self, record: ToolCallRecord) -> mcp_types.CallToolResult:
        """The answer of an ended call: the record's text, the session history's text too."""
        text = tool_output(record.status, record.result, record.error or "")
        return _text_result(
            text,
            error=record.status is not CallStatus.SUCCEEDED,
            key=record.key,
            status=record.status,
            outcome=outcome_of(record.status, record.error),
        )

    # --- transports ----------------------------------------------------------------------------

    async def serve_stdio(self) -> None:
        async with stdio_server() as (read_stream, write_stream):
            await self.server.run(
                read_stream, write_stream, self.server.create_initialization_options()
            )

    def http_app(self, *, host: str, path: str, credentials: Credentials | None = None) -> Any:
        """The streamable HTTP app behind the door (`mcp/http`): Host, Origin, authentication.

        Raises `ConfigurationError` for a bind beyond loopback without credentials.
        """
        credentials = credentials or Credentials.from_settings(self.dex.settings)
        check_bind(host, credentials, "the MCP server")
        allowlist = HostAllowlist.from_settings(self.dex.settings).with_bind(host)
        app = self.server.streamable_http_app(
            streamable_http_path=path,
            stateless_http=True,
            host=host,
            transport_security=SDK_TRANSPORT_SECURITY,
        )
        if not credentials.required:
            log.warning("no DEX_WEB_USERS / DEX_WEB_TOKENS: serving MCP on %s without auth", host)
        return guarded(app, credentials, allowlist)

    async def serve_http(self, *, host: str, port: int, path: str) -> None:
        # Deferred: uvicorn comes with the `mcp` extra and is needed for HTTP only.
        import uvicorn

        app = self.http_app(host=host, path=path)
        config = uvicorn.Config(app, host=host, port=port, log_level="warning", proxy_headers=False)
        await uvicorn.Server(config).serve()


def serve(
    dex: RuntimeSource,
    *,
    transport: str,
    host: str = "127.0.0.1",
    port: int = 8000,
    path: str = "/mcp",
    session_id: str | None = None,
    wait_timeout: float = 300.0,
    task_after: float = 1.0,
) -> None:
    """Run the server until stdin closes (stdio) or the process is stopped (HTTP)."""
    server = DexMcpServer(
        dex, session_id=session_id, wait_timeout=wait_timeout, task_after=task_after
    )
    if transport == "stdio":
        anyio.run(server.serve_stdio)
    else:
        # Refuse an open bind before anything starts (the CLI prints one `error:` line).
        check_bind(host, Credentials.from_settings(dex.settings), "the MCP server")
        anyio.run(lambda: server.serve_http(host=host, port=port, path=path))
