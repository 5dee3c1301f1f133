// file: mastra-agent.ts
// One turn of a Mastra agent whose tools are dex tools over MCP.
import { Agent } from "@mastra/core/agent";
import { MCPClient } from "@mastra/mcp";
import type { ModelMessage } from "ai";

import { type AgentTurn, userTexts } from "./history.ts";

export const turn: AgentTurn = async (url, token, model, history, question) => {
  const mcp = new MCPClient({
    servers: {
      dex: { url: new URL(url), requestInit: { headers: { Authorization: `Bearer ${token}` } } },
    },
  });
  try {
    const messages: ModelMessage[] = [...history, { role: "user", content: question }];
    // Messages sent to the dex session that this history does not hold yet (reconcile reports).
    const news = await mcp.prompts.get({
      serverName: "dex",
      name: "dex-celery/session-messages",
      args: { history: JSON.stringify(userTexts(messages)) },
    });
    for (const m of news.messages) {
      if (m.content.type === "text") messages.push({ role: "user", content: m.content.text });
    }
    const agent = new Agent({
      id: "desk",
      name: "desk",
      instructions: "You help customers with their orders.",
      model,
      tools: await mcp.listTools(),
    });
    const result = await agent.generate(messages, { maxSteps: 5 });
    return [...messages, ...result.response.messages]; // keep it: the next turn's history
  } finally {
    await mcp.disconnect();
  }
};
