// file: ai-sdk-agent.ts
// One turn of a Vercel AI SDK agent whose tools are dex tools over MCP.
import { createMCPClient } from "@ai-sdk/mcp";
import { generateText, stepCountIs, type ModelMessage } from "ai";

import { type AgentTurn, userTexts } from "./history.ts";

export const turn: AgentTurn = async (url, token, model, history, question) => {
  const mcp = await createMCPClient({
    transport: { type: "http", url, headers: { Authorization: `Bearer ${token}` } },
  });
  try {
    const messages: ModelMessage[] = [...history, { role: "user", content: question }];
    // Messages sent to the dex session that this history does not hold yet (reconcile reports).
    const news = await mcp.getPrompt({
      name: "dex-celery/session-messages",
      arguments: { history: JSON.stringify(userTexts(messages)) },
    });
    for (const m of news.messages) {
      if (m.content.type === "text") messages.push({ role: "user", content: m.content.text });
    }
    const tools = await mcp.tools();
    const result = await generateText({ model, tools, messages, stopWhen: stepCountIs(5) });
    return [...messages, ...result.response.messages]; // keep it: the next turn's history
  } finally {
    await mcp.close();
  }
};
