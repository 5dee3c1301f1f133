"""Optional integrations with agent frameworks and MCP; each needs its extra installed."""
