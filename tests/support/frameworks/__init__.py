"""Test helpers of the agent-framework adapters (`dex_celery/integrations/frameworks/`): scripted
agents, the checks every framework's tests share, and the CrewAI skip."""
