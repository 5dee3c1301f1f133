"""The `app` and `dex` of an MCP test app, built on first access (a module `__getattr__`), so
importing the module starts and connects to no MCP server; `celery -A MODULE worker` builds them
at start-up."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from celery import Celery

from dex_celery import Dex


def lazy_app(
    make_app: Callable[[], tuple[Celery, Dex]], built: dict[str, Any]
) -> Callable[[str], Any]:
    """The module's `__getattr__`: `app` and `dex` from `make_app()`, kept in `built` (which a
    test may fill with its own)."""

    def attribute(name: str) -> Any:
        if name in ("app", "dex"):
            if not built:
                built["app"], built["dex"] = make_app()
            return built[name]
        raise AttributeError(name)

    return attribute
