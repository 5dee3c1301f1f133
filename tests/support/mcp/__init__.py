"""Test helpers of MCP both ways (`dex_celery/integrations/mcp/`): the Celery apps whose tools are
MCP servers' (the test server, `mcp-server-git`, an outcome-extension server, a second
deployment's tasks), `dex-celery mcp` run for a test, its clients, and the TypeScript agents."""
