"""The MCP tests' app (`tests.support.mcp.tools_app`) in a worker whose spans go to a file.

`celery -A tests.support.mcp.traced_tools_app worker` with `DEX_TEST_SPANS_FILE` set: the SDK is the
global tracer provider of the worker and its prefork children (`tests.support.apps.span_file`).
"""

from typing import Any

from tests.support.apps.span_file import install

install()

from tests.support.mcp import tools_app  # noqa: E402  (the provider first, then the app)


def __getattr__(name: str) -> Any:
    return getattr(tools_app, name)
