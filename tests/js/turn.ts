/**
 * One agent turn for the Python tests (tests/integration/integrations/test_ts_agents.py,
 * tests/crash/requester/test_ts_conversation.py): runs the docs' example `turn` of a framework
 * with a scripted model, the history read from and saved to JSON files, and writes what the
 * model was sent. Usage: node turn.ts PLAN.json, where the plan is
 * { framework: "ai-sdk" | "mastra", url, token, question, script, historyIn?, historyOut, seenOut }.
 */
import { readFileSync, writeFileSync } from "node:fs";

import { turn as aiSdkTurn } from "./examples/ai-sdk-agent.ts";
import { turn as mastraTurn } from "./examples/mastra-agent.ts";
import { ScriptedModel, type Turn } from "./scripted-model.ts";

type Plan = {
  framework: "ai-sdk" | "mastra";
  url: string;
  token: string;
  question: string;
  script: Turn[];
  historyIn?: string;
  historyOut: string;
  seenOut: string;
};

const plan = JSON.parse(readFileSync(process.argv[2], "utf8")) as Plan;
const history = plan.historyIn ? JSON.parse(readFileSync(plan.historyIn, "utf8")) : [];
const model = new ScriptedModel(plan.script);
const run = plan.framework === "ai-sdk" ? aiSdkTurn : mastraTurn;
try {
  const saved = await run(plan.url, plan.token, model, history, plan.question);
  writeFileSync(plan.historyOut, JSON.stringify(saved, null, 1));
} finally {
  writeFileSync(plan.seenOut, JSON.stringify(model.seen, null, 1));
}
