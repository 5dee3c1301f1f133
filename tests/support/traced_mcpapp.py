"""The MCP tests' app (`tests.support.mcpapp`) in a worker whose spans go to a file.

`celery -A tests.support.traced_mcpapp worker` with `DEX_TEST_SPANS_FILE` set: the SDK is the
global tracer provider of the worker and its prefork children (`tests.support.apps.span_file`).
"""

from typing import Any

from tests.support.apps.span_file import install

install()

from tests.support import mcpapp  # noqa: E402  (the provider first, then the app)


def __getattr__(name: str) -> Any:
    return getattr(mcpapp, name)
