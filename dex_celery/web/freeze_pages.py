"""The web app's write freeze (S13.2): the `/writes` page, its two forms, and the banner.

Freezing and thawing are POSTs behind their own scope, `writes:freeze` (a token without it gets
403), with the CSRF token and same-origin check of every form (`WebApp.gate`), answered only
for the app's own host names (`HostGuard`). Who froze is the signed-in person or the token's
name; SQL records who, when and why (`store/freezes.py`). Every page shows a banner while
writes are frozen (`banner`).
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING
from urllib.parse import quote

# defers an optional dependency: starlette (the `web` extra)
from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import RedirectResponse, Response
from starlette.routing import Route

from dex_celery.access import Identity, Scope
from dex_celery.errors import DexError
from dex_celery.store.freezes import WriteFreezes

if TYPE_CHECKING:
    from dex_celery.app import Dex

#: `WebApp.page` and `WebApp.gate`, handed in (this module must not import the app's module).
PageMaker = Callable[..., Response]
Handler = Callable[[Request, Identity], Awaitable[Response] | Response]
Gate = Callable[[Handler, Scope | None], Callable[[Request], Awaitable[Response]]]

log = logging.getLogger("dex_celery.web")


class FreezePages:
    """`/writes` (read: `calls:read`), `/writes/freeze` and `/writes/thaw` (`writes:freeze`)."""

    def __init__(self, dex: Dex, page: PageMaker, gate: Gate) -> None:
        self.dex = dex
        self.make_page = page
        self.gate = gate
        self.freezes = WriteFreezes(lambda: dex.store.engine, dex.store.audit)

    def banner(self) -> list[str]:
        """One line per freeze in force, for the top of every page; a database that cannot say
        is said too, rather than showing no banner."""
        try:
            return [f.line() for f in self.freezes.active()]
        except Exception as e:
            log.warning("could not read the write freeze for the banner: %s", e)
            return ["could not read whether writes are frozen (the database did not answer)"]

    def page(
        self,
        request: Request,
        identity: Identity,
        *,
        status_code: int = 200,
        error: str | None = None,
    ) -> Response:
        return self.make_page(
            request,
            "writes.html",
            identity,
            status_code,
            history=self.freezes.history(limit=20),
            tools=sorted(self.dex.tools),
            may_freeze=identity.may(Scope.WRITES_FREEZE),
            error=error,
        )

    async def freeze(self, request: Request, identity: Identity) -> Response:
        form = await request.form()
        reason = str(form.get("reason", ""))
        tools = [str(t) for t in form.getlist("tool") if str(t)]
        reject = form.get("mode") == "reject"
        try:
            await run_in_threadpool(
                self.dex.writes.freeze,
                reason=reason,
                by=identity.name,
                tools=tools,
                reject=reject,
            )
        except DexError as e:
            return await run_in_threadpool(self._refused, request, identity, str(e))
        return RedirectResponse(f"/writes?flash={quote('writes frozen')}", status_code=303)

    async def thaw(self, request: Request, identity: Identity) -> Response:
        form = await request.form()
        tools = [str(t) for t in form.getlist("tool") if str(t)]
        try:
            done = await run_in_threadpool(
                self.dex.writes.thaw, by=identity.name, tools=tools or None
            )
        except DexError as e:
            return await run_in_threadpool(self._refused, request, identity, str(e))
        text = f"thawed {len(done.thawed)} freeze(s); released {len(done.released)} held call(s)"
        return RedirectResponse(f"/writes?flash={quote(text)}", status_code=303)

    def _refused(self, request: Request, identity: Identity, error: str) -> Response:
        return self.page(request, identity, status_code=400, error=error)

    def routes(self) -> list[Route]:
        gate = self.gate
        act = Scope.WRITES_FREEZE

        async def show(request: Request, identity: Identity) -> Response:
            return await run_in_threadpool(self.page, request, identity)

        return [
            Route("/writes", gate(show, Scope.CALLS_READ)),
            Route("/writes/freeze", gate(self.freeze, act), methods=["POST"]),
            Route("/writes/thaw", gate(self.thaw, act), methods=["POST"]),
        ]
