"""MCP both ways: MCP servers' tools as dex tools (`client.py`, with its warm sessions in
`sessions.py` and followed tasks in `remote_task.py`/`task_call.py`) and `dex-celery mcp`, dex's
tools served to MCP clients (`server.py`, its HTTP door `http.py`, tasks `tasks.py`).

The modules import the MCP SDK (the `mcp` extra, docs/api.md) with absolute imports, so this
package's name never stands in for the SDK's `mcp`.
"""
