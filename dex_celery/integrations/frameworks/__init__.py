"""The agent-framework adapters, one module per framework, over one call path (`calls.py`).

Each adapter module imports its framework (an extra of its own, docs/api.md), so this package
imports none of them: `from dex_celery.integrations.frameworks.langgraph import dex_tools`.
A new framework is one module here (its ids, its way of asking a person, its history) plus its
scripted model in `dex_celery/testing/models/` (docs/architecture.md, "Where each rule lives").
"""
