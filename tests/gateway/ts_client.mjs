// Drives an MCP server through the stormgate gateway with the official TypeScript SDK
// (@modelcontextprotocol/sdk, pinned in .ci/run) and prints one JSON report on stdout for
// tests/gateway.rs. Run from a directory where the SDK is installed:
//   node --input-type=module -e "$(cat ts_client.mjs)" URL
// Same steps as python_client.py: client A lists and calls every tool (progress and log
// messages counted), storms echo until refused; client B (another session) calls once.
import { Client } from "@modelcontextprotocol/sdk/client/index.js";
import { StreamableHTTPClientTransport } from "@modelcontextprotocol/sdk/client/streamableHttp.js";
import { LoggingMessageNotificationSchema } from "@modelcontextprotocol/sdk/types.js";

const url = new URL(process.argv[1]);
const ARGS = { echo: { text: "hi" }, slow: { ms: 50 }, progress: { steps: 3 }, stats: {} };
const progress = [];
const logs = [];

async function connect(name) {
  const client = new Client({ name, version: "1.0.0" });
  client.setNotificationHandler(LoggingMessageNotificationSchema, (n) => { logs.push(String(n.params.data)); });
  await client.connect(new StreamableHTTPClientTransport(url));
  return client;
}

async function call(client, name, args, options) {
  try {
    const r = await client.callTool({ name, arguments: args }, undefined, options);
    return { ok: !r.isError, text: r.content?.[0]?.text ?? null };
  } catch (e) {
    return { ok: false, exception: e.constructor.name, code: e.code ?? null, message: e.message, data: e.data ?? null };
  }
}

const report = {};
const a = await connect("agent-a");
const b = await connect("agent-b");
const tools = await a.listTools();
report.tools = tools.tools.map((t) => t.name).sort();
report.calls = {};
for (const t of report.tools) {
  const options = t === "progress" ? { onprogress: (p) => progress.push([p.progress, p.total ?? null, p.message ?? null]) } : undefined;
  report.calls[t] = await call(a, t, ARGS[t] ?? {}, options);
}
report.progress = progress;
report.logs = [...logs];
report.refusal = null;
for (let i = 0; i < 100; i++) {
  const answer = await call(a, "echo", { text: `storm-${i}` });
  if (!answer.ok) { answer.after_calls = i + 1; report.refusal = answer; break; }
}
report.other_session = await call(b, "echo", { text: "b" });
await a.close();
await b.close();
console.log(JSON.stringify(report));
