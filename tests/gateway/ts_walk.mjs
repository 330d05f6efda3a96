// A healthy client's ordinary work through the gateway, with the official TypeScript SDK
// (pinned in .ci/run), against the reference server-everything: the feature walk (tools,
// resources, prompts, a few calls), 100 sequential calls as fast as the server answers, 20
// concurrent calls, and 8 one-shot sessions at once. Prints one JSON report on stdout for
// tests/gateway.rs: what the walk saw and every refusal.
//   node --input-type=module -e "$(cat ts_walk.mjs)" URL
import { Client } from "@modelcontextprotocol/sdk/client/index.js";
import { StreamableHTTPClientTransport } from "@modelcontextprotocol/sdk/client/streamableHttp.js";

const url = new URL(process.argv[1]);
const refusals = [];

async function connect(name) {
  const client = new Client({ name, version: "1.0.0" });
  await client.connect(new StreamableHTTPClientTransport(url));
  return client;
}

// One request; a refusal (an error, or an isError result, that says so) is recorded.
async function attempt(what, f) {
  try {
    const r = await f();
    if (r?.isError) {
      const text = r.content?.[0]?.text ?? "";
      if (/rate limited|retry after/i.test(text)) refusals.push({ what, text });
      return null;
    }
    return r;
  } catch (e) {
    refusals.push({ what, code: e.code ?? null, message: e.message });
    return null;
  }
}

const echo = (client, i) => attempt(`echo ${i}`, () => client.callTool({ name: "echo", arguments: { message: `m${i}` } }));

const report = {};
const a = await connect("walker");
const tools = await attempt("tools/list", () => a.listTools());
report.tools = (tools?.tools ?? []).map((t) => t.name).sort();
const resources = await attempt("resources/list", () => a.listResources());
report.resources = (resources?.resources ?? []).length;
if (resources?.resources?.length) {
  const read = await attempt("resources/read", () => a.readResource({ uri: resources.resources[0].uri }));
  report.read = (read?.contents ?? []).length;
}
const templates = await attempt("resources/templates/list", () => a.listResourceTemplates());
report.templates = (templates?.resourceTemplates ?? []).length;
const prompts = await attempt("prompts/list", () => a.listPrompts());
report.prompts = (prompts?.prompts ?? []).length;
const simple = (prompts?.prompts ?? []).find((p) => !(p.arguments ?? []).some((x) => x.required));
if (simple) {
  const got = await attempt("prompts/get", () => a.getPrompt({ name: simple.name }));
  report.prompt_messages = (got?.messages ?? []).length;
}
const sum = await attempt("get-sum", () => a.callTool({ name: "get-sum", arguments: { a: 2, b: 3 } }));
report.sum = sum?.content?.[0]?.text ?? null;
await attempt("ping", () => a.ping());

let ok = 0;
for (let i = 0; i < 100; i++) if (await echo(a, i)) ok++;
report.sequential_ok = ok;
const concurrent = await Promise.all(Array.from({ length: 20 }, (_, i) => echo(a, 100 + i)));
report.concurrent_ok = concurrent.filter(Boolean).length;
const oneShots = await Promise.all(Array.from({ length: 8 }, async (_, i) => {
  const c = await connect(`one-shot-${i}`);
  await attempt("tools/list", () => c.listTools());
  const r = await echo(c, 1000 + i);
  await c.close();
  return r;
}));
report.one_shot_ok = oneShots.filter(Boolean).length;
await a.close();
report.refusals = refusals;
console.log(JSON.stringify(report));
