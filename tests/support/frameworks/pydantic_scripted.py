"""A scripted Pydantic AI model (its `FunctionModel`) for the tests that drive an agent without network."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from pydantic_ai.messages import (
    ModelMessage,
    ModelRequest,
    ModelResponse,
    TextPart,
    ToolCallPart,
    ToolReturnPart,
)
from pydantic_ai.models.function import AgentInfo

Turn = list[ToolCallPart] | str


class Scripted:
    """A `FunctionModel` function: the n-th model response of the conversation is `turns[n]`,
    so a run resumed from its history gets the same script; keeps what the model was given."""

    def __init__(self, turns: Sequence[Turn]) -> None:
        self.turns = list(turns)
        self.seen: list[list[ModelMessage]] = []

    def __call__(self, messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        self.seen.append(list(messages))
        answered = sum(isinstance(m, ModelResponse) for m in messages)
        turn = self.turns[min(answered, len(self.turns) - 1)]
        if isinstance(turn, str):
            return ModelResponse(parts=[TextPart(turn)])
        return ModelResponse(parts=list(turn))

    def tool_results(self, call: int = -1) -> dict[str, Any]:
        """`tool_call_id -> content` of the tool returns in the last request the model read."""
        last = self.seen[call][-1]
        assert isinstance(last, ModelRequest)
        return {p.tool_call_id: p.content for p in last.parts if isinstance(p, ToolReturnPart)}


def call(name: str, args: dict[str, Any], call_id: str) -> ToolCallPart:
    return ToolCallPart(tool_name=name, args=args, tool_call_id=call_id)
