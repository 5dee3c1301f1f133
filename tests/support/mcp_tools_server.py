"""Moved to `devtools.mcp_tools_server` (shared with bench/). This name stays the same module
object for imports, and `python -m tests.support.mcp_tools_server` still serves it."""

import sys

import devtools.mcp_tools_server

if __name__ == "__main__":
    devtools.mcp_tools_server.main()
else:
    sys.modules[__name__] = devtools.mcp_tools_server
