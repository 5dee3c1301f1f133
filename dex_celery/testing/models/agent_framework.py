"""A scripted Microsoft Agent Framework chat client (docs/testing.md, "Scripted models").

`ScriptedChatClient` is an Agent Framework chat client with the framework's own function
invocation and chat-middleware layers (as the framework's clients compose them), so
`Agent(ScriptedChatClient(...), ...)` calls tools, asks for approvals and runs middleware as it
would with a real model. The n-th model response of a conversation is `turns[n]`, chosen by
counting the model responses the request holds, so a run resumed from a saved session follows
the same script; `seen` keeps every request's messages, so a test checks what the model read.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Mapping, Sequence
from typing import Any, ClassVar

from agent_framework import (
    BaseChatClient,
    ChatMiddlewareLayer,
    ChatResponse,
    ChatResponseUpdate,
    Content,
    FunctionInvocationLayer,
    Message,
    ResponseStream,
)

#: One model response: contents (text and function calls), or the final text.
Turn = Sequence[Content] | str


def tool_call(name: str, arguments: Mapping[str, Any], call_id: str) -> Content:
    """A function call the scripted model makes."""
    return Content.from_function_call(call_id=call_id, name=name, arguments=dict(arguments))


def text(words: str) -> Content:
    """A text part of a model response (beside function calls)."""
    return Content.from_text(words)


def model_responses(messages: Sequence[Message]) -> int:
    """How many model responses `messages` hold: each run of consecutive assistant messages is
    one (the framework keeps a response's function calls and its approval requests together)."""
    count, previous = 0, ""
    for message in messages:
        if message.role == "assistant" and previous != "assistant":
            count += 1
        previous = message.role
    return count


class ScriptedChatClient(
    FunctionInvocationLayer[Any],
    ChatMiddlewareLayer[Any],
    BaseChatClient[Any],
):
    """The n-th model response of the conversation is `turns[n]` (the last one repeats)."""

    OTEL_PROVIDER_NAME: ClassVar[str] = "dex-scripted"

    def __init__(self, turns: Sequence[Turn], **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.turns = list(turns)
        #: Every request's messages, in order.
        self.seen: list[list[Message]] = []

    async def _respond(self, messages: Sequence[Message]) -> ChatResponse:
        self.seen.append(list(messages))
        turn = self.turns[min(model_responses(messages), len(self.turns) - 1)]
        contents = [text(turn)] if isinstance(turn, str) else list(turn)
        return ChatResponse(messages=[Message(role="assistant", contents=contents)])

    def _inner_get_response(
        self,
        *,
        messages: Sequence[Message],
        stream: bool,
        options: Mapping[str, Any],
        **kwargs: Any,
    ) -> Any:
        if not stream:
            return self._respond(messages)

        async def updates() -> AsyncIterator[ChatResponseUpdate]:
            response = await self._respond(messages)
            for message in response.messages:
                yield ChatResponseUpdate(role="assistant", contents=list(message.contents))

        return ResponseStream(updates(), finalizer=ChatResponse.from_updates)

    def user_texts(self, call: int = -1) -> list[str]:
        """The user messages (text) of the model's `call`-th request."""
        return [m.text for m in self.seen[call] if m.role == "user" and m.text]

    def tool_results(self, call: int = -1) -> dict[str, str]:
        """`call id -> result text` of the function results in the model's `call`-th request."""
        out: dict[str, str] = {}
        for message in self.seen[call]:
            for content in message.contents:
                if content.type == "function_result" and content.call_id:
                    out[content.call_id] = _result_text(content)
        return out


def _result_text(content: Content) -> str:
    items = content.items or []
    texts = [item.text or "" for item in items if item.type == "text"]
    if texts:
        return "".join(texts)
    return str(content.result or "")
