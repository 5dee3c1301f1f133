"""An agent process for the LangGraph crash test: `create_agent` with dex tools and a SQLite
checkpointer, run as `python -m tests.support.frameworks.langgraph_agent CHECKPOINT THREAD [--resume]`.

Without `--resume` it starts the conversation; with it, it resumes the thread from its last
checkpoint (`invoke(None, config)`), as a restarted process would. It prints the tool messages
the model read, one JSON object a line.
"""

from __future__ import annotations

import json
import sqlite3
import sys

from langchain.agents import create_agent
from langchain_core.messages import AIMessage, HumanMessage, ToolMessage
from langgraph.checkpoint.sqlite import SqliteSaver

from devtools.toolapp import make_app
from dex_celery import Settings
from dex_celery.integrations.frameworks.langgraph import dex_tools
from dex_celery.testing.models.langchain import ScriptedChatModel, tool_call

#: The write the crash test kills the agent process in the middle of.
WRITE = ("slow_non_idempotent_write", {"seconds": 60, "value": "once"}, "call_write")


def main(checkpoint: str, thread: str, resume: bool) -> None:
    _app, dex = make_app(Settings.from_env())
    model = ScriptedChatModel(turns=[tool_call(*WRITE), AIMessage("Done.")])
    saver = SqliteSaver(sqlite3.connect(checkpoint, check_same_thread=False))
    agent = create_agent(model, dex_tools(dex, [WRITE[0]]), checkpointer=saver)
    config = {"configurable": {"thread_id": thread}}
    state = agent.invoke(None if resume else {"messages": [HumanMessage("Send it.")]}, config)
    for message in state["messages"]:
        if isinstance(message, ToolMessage):
            print(json.dumps({"id": message.tool_call_id, "content": message.content}))
    print(json.dumps({"final": state["messages"][-1].content}), flush=True)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], "--resume" in sys.argv[3:])
