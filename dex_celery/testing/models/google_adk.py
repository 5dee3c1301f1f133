"""A scripted Google ADK model (docs/testing.md, "Scripted models").

ADK lets any `BaseLlm` subclass be an agent's model (`LlmAgent(model=ScriptedLlm(...))`). The
n-th model response of a conversation is `turns[n]`, chosen by counting the model contents of
the request, so an invocation resumed from its saved session events (in this process or
another) follows the same script; `seen` keeps every request's contents, so a test checks what
the model read.
"""

from __future__ import annotations

from collections.abc import AsyncGenerator, Mapping, Sequence
from typing import Any

from google.adk.models.base_llm import BaseLlm
from google.adk.models.llm_request import LlmRequest
from google.adk.models.llm_response import LlmResponse
from google.genai import types
from pydantic import Field

#: One model response: parts (text and function calls), or the final text.
Turn = Sequence[types.Part] | str


def tool_call(name: str, arguments: Mapping[str, Any], call_id: str) -> types.Part:
    """A function call the scripted model makes."""
    return types.Part(function_call=types.FunctionCall(name=name, args=dict(arguments), id=call_id))


def text(words: str) -> types.Part:
    """A text part of a model response (beside function calls)."""
    return types.Part(text=words)


class ScriptedLlm(BaseLlm):
    """The n-th model response of the conversation is `turns[n]` (the last one repeats)."""

    model: str = "dex-scripted"
    turns: list[Any]
    #: Every request's contents, in order.
    seen: list[list[types.Content]] = Field(default_factory=list)

    async def generate_content_async(
        self, llm_request: LlmRequest, stream: bool = False
    ) -> AsyncGenerator[LlmResponse, None]:
        self.seen.append(list(llm_request.contents))
        answered = sum(c.role == "model" for c in llm_request.contents)
        turn = self.turns[min(answered, len(self.turns) - 1)]
        parts = [text(turn)] if isinstance(turn, str) else list(turn)
        yield LlmResponse(content=types.Content(role="model", parts=parts))

    def user_texts(self, call: int = -1) -> list[str]:
        """The user messages (text, not function responses) of the model's `call`-th request."""
        return [
            part.text
            for content in self.seen[call]
            if content.role == "user"
            for part in content.parts or []
            if part.text
        ]

    def tool_results(self, call: int = -1) -> dict[str, Any]:
        """`call id -> result` of the function responses in the model's `call`-th request."""
        out: dict[str, Any] = {}
        for content in self.seen[call]:
            for part in content.parts or []:
                response = part.function_response
                if response is not None and response.id:
                    body = response.response or {}
                    out[response.id] = body.get("result", body)
        return out
