"""A scripted LangChain chat model for LangGraph and `create_agent` (docs/testing.md).

The n-th model response of a conversation is `turns[n]`, chosen by counting the AI messages the
model is given, so a graph resumed from its checkpoint (in this process or another) follows the
same script; `seen` keeps every input, so a test checks what the model read.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from langchain_core.language_models import BaseChatModel
from langchain_core.messages import AIMessage, BaseMessage, HumanMessage, ToolMessage
from langchain_core.outputs import ChatGeneration, ChatResult
from pydantic import Field


class ScriptedChatModel(BaseChatModel):
    """The n-th model response of the conversation is `turns[n]` (the last one repeats)."""

    turns: list[AIMessage]
    seen: list[list[BaseMessage]] = Field(default_factory=list)

    def _generate(
        self,
        messages: list[BaseMessage],
        stop: list[str] | None = None,
        run_manager: Any = None,
        **kwargs: Any,
    ) -> ChatResult:
        self.seen.append(list(messages))
        answered = sum(isinstance(m, AIMessage) for m in messages)
        reply = self.turns[min(answered, len(self.turns) - 1)].model_copy()
        return ChatResult(generations=[ChatGeneration(message=reply)])

    def bind_tools(self, tools: Sequence[Any], **kwargs: Any) -> ScriptedChatModel:
        return self

    @property
    def _llm_type(self) -> str:
        return "scripted"

    def tool_results(self, call: int = -1) -> dict[str, str]:
        """`tool_call_id -> content` of the tool messages in one of the model's inputs."""
        return {
            m.tool_call_id: str(m.content) for m in self.seen[call] if isinstance(m, ToolMessage)
        }

    def user_texts(self, call: int = -1) -> list[str]:
        """The user (human) messages of one of the model's inputs."""
        return [str(m.content) for m in self.seen[call] if isinstance(m, HumanMessage)]


def tool_call(name: str, args: dict[str, Any], call_id: str) -> AIMessage:
    """A model response making one tool call."""
    return AIMessage("", tool_calls=[{"name": name, "args": args, "id": call_id}])
