"""A scripted Pydantic AI model (docs/testing.md, "Scripted models")."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from pydantic_ai import messages as ai_messages
from pydantic_ai.models.function import AgentInfo, FunctionModel

#: One model response: tool calls, or the final text.
Turn = Sequence[ai_messages.ToolCallPart] | str


def tool_call(name: str, arguments: Mapping[str, Any], call_id: str) -> ai_messages.ToolCallPart:
    """A tool call the scripted model makes."""
    return ai_messages.ToolCallPart(tool_name=name, args=dict(arguments), tool_call_id=call_id)


class ScriptedModel(FunctionModel):
    """The n-th model response of the conversation is `turns[n]` (the last one repeats)."""

    def __init__(self, turns: Sequence[Turn]) -> None:
        self.turns = list(turns)
        #: Every history the model was sent, in order.
        self.seen: list[list[ai_messages.ModelMessage]] = []
        super().__init__(self._respond, model_name="dex-scripted")

    def _respond(
        self, messages: list[ai_messages.ModelMessage], info: AgentInfo
    ) -> ai_messages.ModelResponse:
        self.seen.append(list(messages))
        answered = sum(isinstance(m, ai_messages.ModelResponse) for m in messages)
        turn = self.turns[min(answered, len(self.turns) - 1)]
        if isinstance(turn, str):
            return ai_messages.ModelResponse(parts=[ai_messages.TextPart(turn)])
        return ai_messages.ModelResponse(parts=list(turn))

    def user_texts(self, request: int = -1) -> list[str]:
        """The user prompts of the history the model was sent in its `request`-th request."""
        return [
            part.content
            for message in self.seen[request]
            if isinstance(message, ai_messages.ModelRequest)
            for part in message.parts
            if isinstance(part, ai_messages.UserPromptPart) and isinstance(part.content, str)
        ]

    def tool_results(self, request: int = -1) -> dict[str, Any]:
        """`tool_call_id -> content` of the tool returns in the last message of a request."""
        last = self.seen[request][-1]
        if not isinstance(last, ai_messages.ModelRequest):
            return {}
        return {
            p.tool_call_id: p.content
            for p in last.parts
            if isinstance(p, ai_messages.ToolReturnPart)
        }

    def tool_calls_made(self) -> list[str]:
        """The ids of the tool calls the script has made in the histories it was sent."""
        return [
            part.tool_call_id
            for message in (self.seen[-1] if self.seen else [])
            if isinstance(message, ai_messages.ModelResponse)
            for part in message.parts
            if isinstance(part, ai_messages.ToolCallPart)
        ]
