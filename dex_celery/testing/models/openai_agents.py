"""A scripted OpenAI Agents SDK model (docs/testing.md, "Scripted models").

The SDK ships one (`agents.testing.ScriptedModel`: steps consumed in order, each call's input
kept); this adds what a dex test reads of it: the user messages and the tool outputs the model
was sent. Build steps with the SDK's `function_call` and `assistant_message`.
"""

from __future__ import annotations

from typing import Any

from agents.testing import ScriptedModel as _SdkScriptedModel
from agents.testing import assistant_message, function_call

__all__ = ["ScriptedModel", "assistant_message", "function_call"]


def _text(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(str(part.get("text", "")) for part in content if isinstance(part, dict))
    return ""


class ScriptedModel(_SdkScriptedModel):
    """The SDK's scripted model, with the readers a dex test needs."""

    def _input(self, call: int) -> list[Any]:
        items: Any = self.calls[call].input
        return list(items) if isinstance(items, list) else [{"role": "user", "content": items}]

    def user_texts(self, call: int = -1) -> list[str]:
        """The user messages of the input of the model's `call`-th call."""
        return [
            _text(item.get("content"))
            for item in self._input(call)
            if isinstance(item, dict) and item.get("role") == "user"
        ]

    def tool_results(self, call: int = -1) -> dict[str, str]:
        """`call_id -> output` of the tool results in the input of the model's `call`-th call."""
        return {
            str(item["call_id"]): str(item["output"])
            for item in self._input(call)
            if isinstance(item, dict) and item.get("type") == "function_call_output"
        }
