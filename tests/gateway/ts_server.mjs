// An upstream MCP server for tests/gateway.rs, on the official TypeScript SDK
// (@modelcontextprotocol/sdk, pinned in .ci/run): McpServer over the SDK's streamable-HTTP
// transport (one session per client), on a free loopback port it prints on stdout as
// `PORT <n>` once it listens. Run from the directory where the SDK is installed:
//   node --input-type=module -e "$(cat ts_server.mjs)"
// Same tools as python_server.py: echo, slow (a pool of two), progress, stats.
import http from "node:http";
import { randomUUID } from "node:crypto";
import { McpServer } from "@modelcontextprotocol/sdk/server/mcp.js";
import { StreamableHTTPServerTransport } from "@modelcontextprotocol/sdk/server/streamableHttp.js";
import { isInitializeRequest } from "@modelcontextprotocol/sdk/types.js";
import { z } from "zod";

const POOL_SIZE = 2;
let free = POOL_SIZE;
const waiters = [];
const counters = { slow_started: 0, slow_finished: 0, slow_cancelled: 0, in_pool: 0 };
const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

async function acquire() {
  if (free > 0) { free -= 1; return; }
  await new Promise((r) => waiters.push(r));
}
function release() {
  const next = waiters.shift();
  if (next) next(); else free += 1;
}

function build() {
  const server = new McpServer({ name: "gateway-upstream-ts", version: "1.0.0" }, { capabilities: { logging: {} } });
  const text = (t) => ({ content: [{ type: "text", text: t }] });
  server.registerTool("echo", { description: "Answers with its argument at once.", inputSchema: { text: z.string() } },
    async ({ text: t }) => text(t));
  server.registerTool("slow", { description: "Holds one of the pool's places for ms milliseconds.", inputSchema: { ms: z.number().int().default(200) } },
    async ({ ms }) => {
      counters.slow_started += 1;
      await acquire();
      counters.in_pool += 1;
      try { await sleep(ms); } finally { counters.in_pool -= 1; release(); }
      counters.slow_finished += 1;
      return text(`slept ${ms} ms`);
    });
  server.registerTool("progress", { description: "One progress notification and one log message per step.", inputSchema: { steps: z.number().int() } },
    async ({ steps }, extra) => {
      const token = extra._meta?.progressToken;
      for (let i = 0; i < steps; i++) {
        if (token !== undefined) {
          await extra.sendNotification({ method: "notifications/progress", params: { progressToken: token, progress: i + 1, total: steps, message: `step ${i + 1}` } });
        }
        await extra.sendNotification({ method: "notifications/message", params: { level: "info", data: `step ${i + 1} of ${steps}` } });
        await sleep(20);
      }
      return text(`${steps} steps`);
    });
  server.registerTool("stats", { description: "The slow tool's counters.", inputSchema: {} },
    async () => text(JSON.stringify(counters)));
  return server;
}

const transports = new Map();

async function readJson(req) {
  const chunks = [];
  for await (const c of req) chunks.push(c);
  const s = Buffer.concat(chunks).toString("utf8");
  return s ? JSON.parse(s) : undefined;
}

const httpServer = http.createServer(async (req, res) => {
  try {
    const sid = req.headers["mcp-session-id"];
    if (req.method === "POST") {
      const body = await readJson(req);
      let transport = sid ? transports.get(sid) : undefined;
      if (!transport && !sid && isInitializeRequest(body)) {
        transport = new StreamableHTTPServerTransport({
          sessionIdGenerator: () => randomUUID(),
          onsessioninitialized: (id) => transports.set(id, transport),
        });
        transport.onclose = () => { if (transport.sessionId) transports.delete(transport.sessionId); };
        await build().connect(transport);
      }
      if (!transport) {
        res.writeHead(sid ? 404 : 400, { "content-type": "application/json" });
        res.end(JSON.stringify({ jsonrpc: "2.0", id: null, error: { code: -32000, message: "no such session" } }));
        return;
      }
      await transport.handleRequest(req, res, body);
      return;
    }
    const transport = sid ? transports.get(sid) : undefined;
    if (!transport) { res.writeHead(sid ? 404 : 400); res.end(); return; }
    await transport.handleRequest(req, res);
  } catch (e) {
    if (!res.headersSent) { res.writeHead(500); }
    res.end();
  }
});

httpServer.listen(0, "127.0.0.1", () => {
  process.stdout.write(`PORT ${httpServer.address().port}\n`);
});
