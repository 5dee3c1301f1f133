// file: history.ts
// What both agents share: a turn's signature, and the user texts of a history kept as the
// AI SDK's `ModelMessage[]`.
import type { LanguageModel, ModelMessage } from "ai";

/** One turn: `question` after `history`, dex's tools at `url`; gives the history to keep. */
export type AgentTurn = (
  url: string,
  token: string,
  model: LanguageModel,
  history: ModelMessage[],
  question: string,
) => Promise<ModelMessage[]>;

/** The user texts a history holds: how dex knows what it already handed this agent. */
export function userTexts(messages: ModelMessage[]): string[] {
  return messages.flatMap((m) => {
    if (m.role !== "user") return [];
    if (typeof m.content === "string") return [m.content];
    return [m.content.map((p) => (p.type === "text" ? p.text : "")).join("")];
  });
}
