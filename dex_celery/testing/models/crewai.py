"""A scripted CrewAI model (docs/testing.md, "Scripted models").

CrewAI lets any `BaseLLM` subclass be an agent's model (`Agent(llm=ScriptedLLM(...))`). The
n-th model response of an agent's conversation is `turns[n]`, chosen by counting the assistant
messages it is sent, so a task run again with the same script (a resumed crew, another process)
follows it the same way; `seen` keeps every request's messages, so a test checks what the
model read. It answers with native tool calls (`supports_function_calling`), the only way a
CrewAI tool call carries the call id dex keys the call with.

Each `Crew.kickoff()` runs a task as a new conversation, so a crew kicked off once per user turn
takes `scripts`: the conversation whose task prompt (its first user message) contains a
script's key follows that script (`requests_of` finds what it was sent).
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
    """The n-th model response of the conversation is `turns[n]` (the last one repeats), or of
    the script whose key its task prompt contains."""

    model: str = "dex-scripted"
    turns: list[Any] = Field(default_factory=list)
    #: `text in the task prompt -> turns`, for a crew kicked off once per user turn.
    scripts: dict[str, list[Any]] = Field(default_factory=dict)
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
        turns = self._script(messages)
        turn = turns[min(answered, len(turns) - 1)]
        return turn if isinstance(turn, str) else [dict(c) for c in turn]

    def _script(self, messages: list[dict[str, Any]]) -> list[Any]:
        prompt = _prompt(messages)
        for key, turns in self.scripts.items():
            if key in prompt:
                return turns
        return self.turns

    def requests_of(self, prompt: str) -> list[int]:
        """The indexes in `seen` of the requests of the conversations whose task prompt holds
        `prompt`, in order."""
        return [i for i, sent in enumerate(self.seen) if prompt in _prompt(sent)]

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


def _prompt(messages: Sequence[Mapping[str, Any]]) -> str:
    """The conversation's task prompt: its first user message."""
    return next(
        (str(m.get("content")) for m in messages if m.get("role") == "user"),
        "",
    )
