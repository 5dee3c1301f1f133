/**
 * A scripted language model for the tests and the docs' examples: each model request gets the
 * next turn of the script (tool calls, or a text), offline. It keeps every request's messages as
 * `{ role, text }`, so a test reads what the model was sent (docs/frameworks.md, "Vercel AI SDK
 * (TypeScript, over MCP)"). One model works for the Vercel AI SDK (`doGenerate`) and Mastra,
 * whose agent streams (`doStream`): both read the `LanguageModelV4` specification.
 */
import { MockLanguageModelV4 } from "ai/test";

export type ToolCall = { tool: string; input: Record<string, unknown>; id: string };
/** A turn: a reply text, or the tool calls of one model response. */
export type Turn = string | ToolCall[];
/** One message of a model request as the test reads it. */
export type Seen = { role: string; text: string };

const usage = {
  inputTokens: { total: 1, noCache: 1, cacheRead: 0, cacheWrite: 0 },
  outputTokens: { total: 1, text: 1, reasoning: 0 },
};

function asText(content: unknown): string {
  if (typeof content === "string") return content;
  if (!Array.isArray(content)) return JSON.stringify(content);
  return content
    .map((part) => {
      if (part.type === "text") return part.text as string;
      if (part.type === "tool-call") return `call ${part.toolName} ${JSON.stringify(part.input)}`;
      if (part.type === "tool-result") return JSON.stringify(part.output);
      return "";
    })
    .join("\n");
}

function content(turn: Turn) {
  if (typeof turn === "string") return [{ type: "text" as const, text: turn }];
  return turn.map((c) => ({
    type: "tool-call" as const,
    toolCallId: c.id,
    toolName: c.tool,
    input: JSON.stringify(c.input),
  }));
}

export class ScriptedModel extends MockLanguageModelV4 {
  /** Each request's messages, in order. */
  readonly seen: Seen[][] = [];

  constructor(turns: Turn[]) {
    const next = (prompt: { role: string; content: unknown }[]) => {
      this.seen.push(prompt.map((m) => ({ role: m.role, text: asText(m.content) })));
      const turn = turns.shift();
      if (turn === undefined) throw new Error("the script has no more turns");
      const finishReason = {
        unified: typeof turn === "string" ? ("stop" as const) : ("tool-calls" as const),
        raw: undefined,
      };
      return { turn, finishReason };
    };
    super({
      provider: "scripted",
      modelId: "scripted",
      doGenerate: async ({ prompt }) => {
        const { turn, finishReason } = next(prompt);
        return { content: content(turn), finishReason, usage, warnings: [] };
      },
      doStream: async ({ prompt }) => {
        const { turn, finishReason } = next(prompt);
        const parts: unknown[] = [{ type: "stream-start", warnings: [] }];
        for (const part of content(turn)) {
          if (part.type === "text") {
            parts.push({ type: "text-start", id: "t" }, { type: "text-delta", id: "t", delta: part.text }, { type: "text-end", id: "t" });
          } else {
            parts.push(part);
          }
        }
        parts.push({ type: "finish", finishReason, usage });
        const stream = new ReadableStream({
          start(controller) {
            for (const part of parts) controller.enqueue(part);
            controller.close();
          },
        });
        return { stream } as never;
      },
    });
  }

  /** The user texts of a request's messages (the last request by default). */
  userTexts(request = -1): string[] {
    const seen = this.seen.at(request) ?? [];
    return seen.filter((m) => m.role === "user").map((m) => m.text);
  }
}
