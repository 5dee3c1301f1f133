"""Tools as people write them: the `Tool` value, its arguments and schema, secrets, invocation.

`tool.py` holds the registered tool and its context, `arguments.py` and `schema.py` check what a
model sends, `definitions.py` describes a tool to a model, `sealing.py` and `redact.py` keep
secret arguments sealed and hidden, `invoke.py` calls the function on a worker.
"""

from dex_celery.tools.tool import TASK_PREFIX, Tool, ToolContext, find_tool

__all__ = ["TASK_PREFIX", "Tool", "ToolContext", "find_tool"]
