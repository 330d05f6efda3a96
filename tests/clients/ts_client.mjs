// Drives a stormgate-protected MCP server with the official TypeScript SDK
// (@modelcontextprotocol/sdk, pinned in .ci/run) and prints one JSON report on stdout for
// tests/clients.rs to assert on. Run from a directory where the SDK is installed:
//   node --input-type=module -e "$(cat ts_client.mjs)" URL [STORM_TOOL]
// Same steps as python_client.py: clients A and B; A lists and calls every tool, storms
// cache_get until refused; B calls once; A waits the retry hint and calls again.
import { Client } from "@modelcontextprotocol/sdk/client/index.js";
import { StreamableHTTPClientTransport } from "@modelcontextprotocol/sdk/client/streamableHttp.js";

// With -e, argv is [node, URL, STORM_TOOL?].
const url = new URL(process.argv[1]);
const stormTool = process.argv[2] ?? "cache_get";
const ARGS = {
  cache_get: { key: "k" },
  vector_search: { query: "weather" },
  sql_scan: { table: "orders" },
  read_doc: { id: "d1" },
  create_order: { item: "pen", quantity: 1 },
};

async function connect(name) {
  const client = new Client({ name, version: "1.0.0" });
  await client.connect(new StreamableHTTPClientTransport(url));
  return client;
}

async function call(client, name, args) {
  try {
    const r = await client.callTool({ name, arguments: args });
    return {
      ok: !r.isError,
      is_error: Boolean(r.isError),
      text: r.content?.[0]?.text ?? null,
      structured: r.structuredContent ?? null,
      meta: r._meta ?? null,
    };
  } catch (e) {
    return { ok: false, exception: e.constructor.name, code: e.code ?? null, message: e.message, data: e.data ?? null };
  }
}

const report = { protocol: null };
const a = await connect("a");
const b = await connect("b");
report.protocol = a.transport?.protocolVersion ?? null;
const tools = await a.listTools();
report.tools = tools.tools.map((t) => t.name).sort();
report.calls = {};
for (const t of report.tools) report.calls[t] = await call(a, t, ARGS[t] ?? {});
report.refusal = null;
for (let i = 0; i < 100; i++) {
  const answer = await call(a, stormTool, stormTool === "cache_get" ? { key: `storm-${i}` } : {});
  if (!answer.ok) {
    report.refusal = { ...answer, after_calls: i + 1 };
    break;
  }
}
report.other_client = await call(b, "cache_get", { key: "b" });
if (report.refusal) {
  const data =
    report.refusal.data ?? report.refusal.structured ?? report.refusal.meta?.["io.stormgate/rejection"] ?? {};
  await new Promise((r) => setTimeout(r, data.retryAfterMs ?? data.retry_after_ms ?? 0));
  report.after_waiting = await call(a, "cache_get", { key: "again" });
}
await a.close();
await b.close();
console.log(JSON.stringify(report));
