"""The test tools' app (`devtools.toolapp`) in a worker whose spans go to a file.

`celery -A tests.support.apps.traced_toolapp worker` with `DEX_TEST_SPANS_FILE` set: the SDK is the
global tracer provider of the worker (and of its prefork children), writing JSON lines
(`tests.support.apps.span_file`).
"""

from tests.support.apps.span_file import install

install()

from devtools.toolapp import app, dex  # noqa: E402  (the provider first, then the app)

__all__ = ["app", "dex"]
