"""A scripted CrewAI model (docs/testing.md, "Scripted models").

CrewAI lets any `BaseLLM` subclass be an agent's model (`Agent(llm=ScriptedLLM(...))`). The
n-th model response of an agent's conversation is `turns[n]`, chosen by counting the assistant
messages it is sent, so a task run again with the same script (a resumed crew, another process)
follows it the same way; `seen` keeps every request's messages, so a test checks what the
model read. It answers with native tool calls (`supports_function_calling`), the only way a
CrewAI tool call carries the call id dex keys the call with.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

from crewai.llms.base_llm import BaseLLM
from pydantic import Field

#: One model response: tool calls (`tool_call(...)`), or the final text.
Turn = Sequence[dict[str, Any]] | str


def tool_call(name: str, arguments: Mapping[str, Any], call_id: str) -> dict[str, Any]:
    """A tool call the scripted model makes (OpenAI's shape, which CrewAI reads natively)."""
    return {
        "id": call_id,
        "type": "function",
        "function": {"name": name, "arguments": json.dumps(dict(arguments))},
    }


class ScriptedLLM(BaseLLM):
    """The n-th model response of the conversation is `turns[n]` (the last one repeats)."""

    model: str = "dex-scripted"
    turns: list[Any]
    #: Every request's messages, in order.
    seen: list[list[dict[str, Any]]] = Field(default_factory=list)

    def __init__(self, **data: Any) -> None:
        data.setdefault("model", "dex-scripted")  # CrewAI's validator wants it given
        super().__init__(**data)

    def supports_function_calling(self) -> bool:
        return True

    def call(
        self,
        messages: Any,
        tools: Any = None,
        callbacks: Any = None,
        available_functions: Any = None,
        from_task: Any = None,
        from_agent: Any = None,
        response_model: Any = None,
    ) -> Any:
        if isinstance(messages, str):
            messages = [{"role": "user", "content": messages}]
        self.seen.append([dict(m) for m in messages])
        answered = sum(m.get("role") == "assistant" for m in messages)
        turn = self.turns[min(answered, len(self.turns) - 1)]
        return turn if isinstance(turn, str) else [dict(c) for c in turn]

    def user_texts(self, call: int = -1) -> list[str]:
        """The user messages of the model's `call`-th request (the task prompt first)."""
        return [
            m["content"]
            for m in self.seen[call]
            if m.get("role") == "user" and isinstance(m.get("content"), str)
        ]

    def tool_results(self, call: int = -1) -> dict[str, str]:
        """`call id -> result` of the tool messages in the model's `call`-th request."""
        return {
            m["tool_call_id"]: m["content"]
            for m in self.seen[call]
            if m.get("role") == "tool" and m.get("tool_call_id")
        }
