"""The Starlette application: routes, authentication gate, pages.

GET handlers are plain functions (Starlette runs them in its thread pool, since SQLAlchemy and
redis-py block); POST handlers read the form, check the CSRF token and origin, then do the work in
the thread pool too.
"""

from __future__ import annotations

import calendar
import functools
import json
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import quote

# defers an optional dependency: starlette, jinja2, prometheus_client (the `web` extra)
import jinja2
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import HTMLResponse, PlainTextResponse, RedirectResponse, Response
from starlette.routing import Route

from dex_celery.access import (
    SECURITY_HEADERS,
    HostAllowlist,
    HostGuard,
    LoginThrottle,
    Scope,
    TrustedProxies,
    read_authorization,
)
from dex_celery.errors import DexError, UnknownCall
from dex_celery.model.ids import CallKey
from dex_celery.model.links import SESSIONS_PATH, session_path
from dex_celery.model.outcomes import CallStatus
from dex_celery.model.times import format_utc
from dex_celery.ops.budgets import declared_budgets, scope_views
from dex_celery.ops.metrics import registry_for
from dex_celery.ops.present import (
    approval_contexts,
    call_details,
    cut_value,
    decision_banner,
    started_counts,
)
from dex_celery.ops.timeline import session_timeline
from dex_celery.store.unknowns import UnknownOutcomes
from dex_celery.store.views import CallSearch, OperatorViews
from dex_celery.web.auth import (
    COOKIE,
    SESSION_SECONDS,
    Credentials,
    Identity,
    RedisRevocations,
    Signer,
    local_identity,
    safe_next,
    same_origin,
)
from dex_celery.web.freeze_pages import FreezePages

if TYPE_CHECKING:
    from dex_celery.app import Dex

TEMPLATES = Path(__file__).parent / "templates"


def time_left(deadline: float | None, now: float) -> str:
    if not deadline:
        return "-"
    seconds = int(deadline - now)
    if seconds <= 0:
        return "passed"
    hours, rest = divmod(seconds, 3600)
    minutes, secs = divmod(rest, 60)
    if hours:
        return f"{hours}h {minutes:02d}m"
    return f"{minutes}m {secs:02d}s" if minutes else f"{secs}s"


def _utc(value: float | None) -> str:
    return format_utc(value, millis=False)


def _json(value: Any) -> str:
    """A JSON value as a person reads it: indented, keys sorted, never Python's `True`/`[...]`."""
    return json.dumps(value, ensure_ascii=False, sort_keys=True, indent=2)


def _json_inline(value: Any) -> str:
    """One JSON value on one line (a policy field: `true`, `["card"]`, `300.0`)."""
    return json.dumps(value, ensure_ascii=False, sort_keys=True)


def parse_time(text: str | None) -> float | None:
    """`YYYY-MM-DDTHH:MM` (an HTML datetime-local field), read as UTC."""
    if not text:
        return None
    for fmt in ("%Y-%m-%dT%H:%M", "%Y-%m-%dT%H:%M:%S", "%Y-%m-%d"):
        try:
            return float(calendar.timegm(time.strptime(text, fmt)))
        except ValueError:
            continue
    raise ValueError(f"not a time: {text!r} (use YYYY-MM-DDTHH:MM, UTC)")


class WebApp:
    """Holds the deployment, the credentials and the signer; builds the Starlette app."""

    def __init__(
        self, dex: Dex, credentials: Credentials | None = None, *, bind: str | None = None
    ) -> None:
        self.dex = dex
        self.credentials = credentials or Credentials.from_settings(dex.settings)
        self.signer = Signer(
            dex.settings.web_secret_key,
            RedisRevocations(lambda: dex.redis, dex.settings.key_prefix),
        )
        hosts = HostAllowlist.from_settings(dex.settings)
        #: `Host` names answered: loopback, `allowed_hosts`, and the bind address if it is one IP.
        self.hosts = hosts.with_bind(bind) if bind else hosts
        self.proxies = TrustedProxies.from_settings(dex.settings)
        self.throttle = LoginThrottle()
        self.views = OperatorViews(dex.store)
        self.registry = registry_for(dex)
        self.env = jinja2.Environment(
            loader=jinja2.FileSystemLoader(str(TEMPLATES)),
            autoescape=True,
            undefined=jinja2.StrictUndefined,
        )
        self.env.filters["utc"] = _utc
        self.env.filters["tojson_text"] = _json
        self.env.filters["tojson_inline"] = _json_inline
        self.env.filters["utc_millis"] = format_utc
        self.env.filters["session_path"] = session_path
        self.freeze_pages = FreezePages(dex, self.page, self.gate)

    # --- plumbing ------------------------------------------------------------------------------

    def identity(self, request: Request) -> Identity | None:
        found = self.authenticate(request)
        return found if isinstance(found, Identity) else None

    def authenticate(self, request: Request) -> Identity | Response | None:
        """The signed-in user, a token or Basic pair; a 429 while its name or address is
        throttled; None if nobody is signed in."""
        if not self.credentials.required:
            return local_identity()
        found = self.signer.read_cookie(request.cookies.get(COOKIE))
        if found is not None and found.name in self.credentials.users:
            return found
        header = request.headers.get("authorization")
        if not header:
            return None
        address = self.client_address(request)
        auth = read_authorization(self.credentials, header)
        wait = self.throttle.retry_after(auth.name, address)
        if wait > 0:
            return too_many(wait)
        if auth.identity is None:
            self.throttle.failed(auth.name, address)
        return auth.identity

    def scheme(self, request: Request) -> str:
        """`https` if this request came over TLS, here or at a proxy the settings trust."""
        peer = request.client.host if request.client else None
        return self.proxies.scheme(
            peer, request.url.scheme, request.headers.get("x-forwarded-proto")
        )

    def client_address(self, request: Request) -> str:
        peer = request.client.host if request.client else None
        return self.proxies.client(peer, request.headers.get("x-forwarded-for"))

    def page(
        self,
        request: Request,
        template: str,
        identity: Identity | None,
        status_code: int = 200,
        **context: Any,
    ) -> HTMLResponse:
        html = self.env.get_template(template).render(
            user=identity.name if identity else None,
            # The write freeze's banner, on every page of a signed-in person (S13.2).
            frozen=self.freeze_pages.banner() if identity else [],
            csrf=self.signer.csrf_token(identity) if identity else "",
            auth_required=self.credentials.required,
            path=request.url.path,
            flash=context.pop("flash", request.query_params.get("flash")),
            error=context.pop("error", None),
            **context,
        )
        return HTMLResponse(html, status_code=status_code)

    def gate(
        self,
        handler: Callable[[Request, Identity], Awaitable[Response] | Response],
        scope: Scope | None = None,
    ) -> Callable[[Request], Awaitable[Response]]:
        """Every non-public route: who is it (or 401 / sign-in), may they (`scope`, else 403),
        and for POSTs, CSRF + origin."""

        async def endpoint(request: Request) -> Response:
            identity = self.authenticate(request)
            if isinstance(identity, Response):
                return identity
            if identity is None:
                if request.method == "GET" and request.url.path != "/metrics":
                    target = request.url.path + (
                        f"?{request.url.query}" if request.url.query else ""
                    )
                    return RedirectResponse(f"/login?next={_quote(target)}", status_code=303)
                # A challenge only where a script reads it: a browser would open a password
                # dialog over a refused form post.
                challenge = {"WWW-Authenticate": 'Basic realm="dex-celery"'}
                return PlainTextResponse(
                    "refused: authentication required\n",
                    status_code=401,
                    headers=challenge if request.method == "GET" else None,
                )
            if scope is not None and not identity.may(scope):
                return PlainTextResponse(
                    f"refused: {identity.name} may not do this (needs the scope {scope.value})\n",
                    status_code=403,
                )
            if request.method == "POST":
                refusal = await self.check_post(request, identity)
                if refusal is not None:
                    return refusal
            result = handler(request, identity)
            if isinstance(result, Response):
                return result
            return await result

        return endpoint

    async def check_post(self, request: Request, identity: Identity) -> Response | None:
        if not self.origin_ok(request):
            return PlainTextResponse("cross-site request refused\n", status_code=403)
        form = await request.form()
        token = form.get("csrf")
        if not self.signer.check_csrf(identity, token if isinstance(token, str) else None):
            return PlainTextResponse(
                "missing or wrong CSRF token: reload the page and try again\n", status_code=403
            )
        return None

    def origin_ok(self, request: Request) -> bool:
        host = request.headers.get("host")
        scheme = self.scheme(request)
        origin = request.headers.get("origin")
        if origin is not None:
            return same_origin(origin, host, scheme)
        referer = request.headers.get("referer")
        return referer is None or same_origin(referer, host, scheme)

    # --- sign-in -------------------------------------------------------------------------------

    def login_form(self, request: Request) -> Response:
        if not self.credentials.required:
            return RedirectResponse("/approvals", status_code=303)
        return self.page(
            request, "login.html", None, next=safe_next(request.query_params.get("next"))
        )

    async def login(self, request: Request) -> Response:
        if not self.origin_ok(request):
            return PlainTextResponse("cross-site request refused\n", status_code=403)
        form = await request.form()
        name, password = str(form.get("name", "")), str(form.get("password", ""))
        target = safe_next(str(form.get("next", "/")))
        address = self.client_address(request)
        wait = self.throttle.retry_after(name, address)
        if wait > 0:
            return too_many(wait)
        if not self.credentials.check_password(name, password):
            self.throttle.failed(name, address)
            return self.page(
                request, "login.html", None, 401, next=target, error="wrong name or password"
            )
        response = RedirectResponse(target if target != "/" else "/approvals", status_code=303)
        response.set_cookie(
            COOKIE,
            self.signer.session_cookie(name),
            max_age=SESSION_SECONDS,
            httponly=True,
            samesite="strict",
            secure=self.scheme(request) == "https",
        )
        return response

    def logout(self, request: Request, identity: Identity) -> Response:
        """Sign-out on the server: the cookie's nonce is revoked, so a copy of it is refused."""
        self.signer.revoke(identity)
        response = RedirectResponse("/login", status_code=303)
        response.delete_cookie(COOKIE, httponly=True, samesite="strict")
        return response

    # --- approvals -----------------------------------------------------------------------------

    def approvals_page(
        self, request: Request, identity: Identity, *, status_code: int = 200, **extra: Any
    ) -> HTMLResponse:
        now = self.dex.store.clock()
        pending = self.dex.approvals.pending(limit=500)
        contexts = approval_contexts(self.dex, self.dex.tools, pending)
        rows = [
            {
                "item": p,
                "arguments": _json(cut_value(p.arguments)[0]),  # shown_arguments (PendingApproval)
                # The whole arguments, to edit (secrets `***`: kept unless replaced, S13.3).
                "editable": json.dumps(p.arguments, indent=2, sort_keys=True, ensure_ascii=False),
                "left": time_left(p.deadline, now),
                "context": context,
            }
            for p, context in zip(pending, contexts, strict=True)
        ]
        return self.page(request, "approvals.html", identity, status_code, rows=rows, **extra)

    def _refused_decision(self, request: Request, identity: Identity, error: str) -> Response:
        """A decision the store refused (decided already, deadline passed...): say why (409)."""
        return self.approvals_page(request, identity, status_code=409, error=error)

    async def decide(self, request: Request, identity: Identity) -> Response:
        form = await request.form()
        key, action = str(form.get("key", "")), str(form.get("action", ""))
        note = str(form.get("note", "")) or None
        try:
            if action == "approve":
                record = await run_in_threadpool(
                    self.dex.approvals.approve, key, identity.name, note
                )
            elif action == "edit":
                # Approve with the edited arguments (S13.3): checked against the tool's schema,
                # a refusal stores nothing and is shown on the page (409).
                edit = str(form.get("arguments", ""))
                record = await run_in_threadpool(
                    functools.partial(
                        self.dex.approvals.approve, key, identity.name, note, edit=edit
                    )
                )
            elif action == "reject":
                record = await run_in_threadpool(
                    self.dex.approvals.reject, key, identity.name, note
                )
            else:
                return PlainTextResponse(f"unknown action {action!r}\n", status_code=400)
        except DexError as e:
            return await run_in_threadpool(self._refused_decision, request, identity, str(e))
        # The call page words the banner from the record as it is when the page is read: the
        # call may have run (or ended) between the decision and the redirect.
        return RedirectResponse(f"/calls/{_quote(record.key)}?decided=1", status_code=303)

    # --- calls ---------------------------------------------------------------------------------

    def calls_page(self, request: Request, identity: Identity) -> Response:
        q = request.query_params
        error = None
        try:
            status = CallStatus(q["status"]) if q.get("status") else None
            search = CallSearch(
                session_id=q.get("session") or None,
                tool_name=q.get("tool") or None,
                status=status,
                since=parse_time(q.get("since")),
                until=parse_time(q.get("until")),
                limit=int(q.get("limit") or 100),
            )
            calls = self.views.search(search)
        except ValueError as e:
            calls, error = [], str(e)
        started = started_counts(self.dex, calls)
        return self.page(
            request,
            "calls.html",
            identity,
            400 if error else 200,
            calls=calls,
            started=started,
            q={k: q.get(k, "") for k in ("session", "tool", "status", "since", "until", "limit")},
            statuses=[s.value for s in CallStatus],
            tools=self.views.tool_names(),
            error=error,
        )

    def call_page(self, request: Request, identity: Identity) -> Response:
        key = request.path_params["key"]
        try:
            CallKey.parse(key)
            record = self.dex.store.get_call(key)
            if record is None:
                raise UnknownCall(f"no tool call {key!r}")
        except DexError as e:
            return self.page(request, "error.html", identity, 404, error=str(e))
        full = request.query_params.get("full") == "1"
        # arguments: tools/redact.shown_arguments; long values cut unless ?full=1
        details = call_details(self.dex, record, full=full)
        unknown = UnknownOutcomes(self.dex.store).get(key)
        extra: dict[str, Any] = {}
        if request.query_params.get("decided") and record.approval is not None:
            extra["flash"] = decision_banner(record)
        return self.page(
            request,
            "call.html",
            identity,
            d=details,
            record=record,
            unknown=unknown,
            finished=record.status.terminal,
            full=full,
            **extra,
        )

    # --- one session as one story (S13.6) ------------------------------------------------------

    def session_page(self, request: Request, identity: Identity) -> Response:
        """The session's timeline (`ops/timeline.py`, as `sessions show`); it refreshes while a
        call of the session is open. No such session, or an id no call could have: 404."""
        session_id = request.path_params["session_id"]
        full = request.query_params.get("full") == "1"
        try:
            timeline = session_timeline(
                self.dex, session_id, checked_tools=self.dex.outcome_checks.tool_names, full=full
            )
        except DexError as e:
            return self.page(request, "error.html", identity, 404, error=str(e))
        return self.page(request, "session.html", identity, t=timeline, full=full)

    # --- unknown outcomes ----------------------------------------------------------------------

    def unknowns_page(self, request: Request, identity: Identity) -> HTMLResponse:
        items = self.views.unreported_unknowns(limit=500)
        sessions = sorted({i.record.session_id for i in items})
        checks = self.dex.outcome_checks.tool_names
        return self.page(
            request,
            "unknowns.html",
            identity,
            items=items,
            sessions=sessions,
            checks=checks,
        )

    def budgets_page(self, request: Request, identity: Identity) -> HTMLResponse:
        """Every write budget scope: used, held and left (S13.1)."""
        declared = declared_budgets(self.dex, self.dex.tools.values())
        views = scope_views(self.dex, declared)
        return self.page(
            request, "budgets.html", identity, views=views, declared=list(declared.values())
        )

    async def reconcile(self, request: Request, identity: Identity) -> Response:
        form = await request.form()
        session_id = str(form.get("session", ""))
        try:
            result = await run_in_threadpool(self.dex.reconciler.reconcile_session, session_id)
        except DexError as e:
            return self.page(request, "error.html", identity, 400, error=str(e))
        return RedirectResponse(f"/unknowns?flash={_quote(result.summary())}", status_code=303)

    # --- metrics and health --------------------------------------------------------------------

    def metrics(self, request: Request, identity: Identity) -> Response:
        return Response(generate_latest(self.registry), media_type=CONTENT_TYPE_LATEST)

    def stylesheet(self, request: Request) -> Response:
        return Response(
            (TEMPLATES / "dex.css").read_text(),
            media_type="text/css",
            headers={"cache-control": "max-age=300"},
        )

    def build(self) -> Starlette:
        """The app behind the `Host` check, every answer with the security headers."""
        gate = self.gate
        read, decide = Scope.CALLS_READ, Scope.APPROVALS_DECIDE

        def home(request: Request, identity: Identity) -> Response:
            return RedirectResponse("/approvals", status_code=303)

        routes = [
            Route("/", gate(home)),
            Route("/login", self.login_form, methods=["GET"]),
            Route("/login", self.login, methods=["POST"]),
            Route("/logout", gate(self.logout), methods=["POST"]),
            Route("/healthz", lambda r: PlainTextResponse("ok\n")),
            Route("/static/dex.css", self.stylesheet),
            Route("/approvals", gate(self._threaded(self.approvals_page), read)),
            Route("/approvals/decide", gate(self.decide, decide), methods=["POST"]),
            Route("/calls", gate(self._threaded(self.calls_page), read)),
            Route("/calls/{key:path}", gate(self._threaded(self.call_page), read)),
            Route(SESSIONS_PATH + "{session_id}", gate(self._threaded(self.session_page), read)),
            Route("/unknowns", gate(self._threaded(self.unknowns_page), read)),
            Route("/budgets", gate(self._threaded(self.budgets_page), read)),
            Route("/unknowns/reconcile", gate(self.reconcile, decide), methods=["POST"]),
            Route("/metrics", gate(self._threaded(self.metrics), Scope.METRICS)),
            *self.freeze_pages.routes(),
        ]
        app = Starlette(routes=routes)
        app.add_middleware(HostGuard, allowlist=self.hosts, headers=SECURITY_HEADERS)
        return app

    @staticmethod
    def _threaded(
        handler: Callable[[Request, Identity], Response],
    ) -> Callable[[Request, Identity], Awaitable[Response]]:
        """Run a blocking page handler in Starlette's thread pool."""

        async def run(request: Request, identity: Identity) -> Response:
            return await run_in_threadpool(handler, request, identity)

        return run


def too_many(wait: float) -> Response:
    """429 for a throttled name or address, with when to try again."""
    seconds = max(1, int(wait + 0.999))
    return PlainTextResponse(
        f"refused: too many failed sign-ins; try again in {seconds}s\n",
        status_code=429,
        headers={"Retry-After": str(seconds)},
    )


def _quote(text: str) -> str:
    return quote(text, safe="/")


def create_app(
    dex: Dex, credentials: Credentials | None = None, *, bind: str | None = None
) -> Starlette:
    """The ASGI app of `dex-celery web` (also for `uvicorn --factory`-style embedding); `bind`
    is the address it listens on, answered as a `Host` too when it is one IP address."""
    return WebApp(dex, credentials, bind=bind).build()
