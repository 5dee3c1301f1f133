"""Tools as people write them: the `Tool` value, its arguments and schema, its secrets.

`tool.py` holds the registered tool and its context, `arguments.py` and `schema.py` check what a
model sends, `definitions.py` describes a tool to a model, `sealing.py` and `redact.py` keep
secret arguments sealed and hidden. How a worker calls the function is the engine's
(`dex_celery.engine.attempt.invoke`).
"""

from dex_celery.tools.tool import TASK_PREFIX, Tool, ToolContext, find_tool

__all__ = ["TASK_PREFIX", "Tool", "ToolContext", "find_tool"]
