"""Scripted models for agents in each supported framework: no network, no model weights.

Each follows a script (tool calls, then text) chosen by how many model responses the
conversation already holds, so a run resumed from its saved history follows the same script;
each keeps what it was sent, so a test asserts what the model read (a tool's record, a
reconciliation report). One module per framework, imported only where that framework is:

- `dex_celery.testing.models.pydantic_ai`: `ScriptedModel` (a Pydantic AI `FunctionModel`);
- `dex_celery.testing.models.langchain`: `ScriptedChatModel` (a LangChain chat model, for
  LangGraph and `create_agent`);
- `dex_celery.testing.models.openai_agents`: `ScriptedModel` (the OpenAI Agents SDK's own
  scripted model, with the same reading helpers);
- `dex_celery.testing.models.google_adk`: `ScriptedLlm` (a Google ADK `BaseLlm`);
- `dex_celery.testing.models.crewai`: `ScriptedLLM` (a CrewAI `BaseLLM`);
- `dex_celery.testing.models.claude_messages`: `ScriptedMessages` (a Messages API server for the
  `claude` CLI the Claude Agent SDK runs).
- `dex_celery.testing.models.agent_framework`: `ScriptedChatClient` (a Microsoft Agent Framework
  chat client with its function invocation and chat middleware layers).
"""
