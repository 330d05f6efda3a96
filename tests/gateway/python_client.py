"""Drives an MCP server through the stormgate gateway with the official Python SDK (`mcp`,
pinned in .ci/run) and prints one JSON report on stdout for tests/gateway.rs.

usage: python_client.py URL [burst]

Client A lists the tools and calls each once (the `progress` call with a progress callback
and a logging callback: what arrives through the stream is counted), then storms `echo` until
refused; client B (another session) then calls `echo` once.

With `burst`: one client fires six `slow` calls of 300 ms at once, then reads the upstream's
`stats`.
"""

import asyncio
import json
import sys

from mcp import Client
from mcp.shared.exceptions import MCPError
from mcp_types import Implementation

ARGS = {"echo": {"text": "hi"}, "slow": {"ms": 50}, "progress": {"steps": 3}, "stats": {}}


async def call(client, name, args, **kw):
    try:
        r = await client.call_tool(name, args, **kw)
        text = r.content[0].text if r.content else None
        return {"ok": not r.is_error, "text": text}
    except MCPError as e:
        return {"ok": False, "code": e.code, "message": e.message, "data": e.data}
    except Exception as e:  # reported, not hidden
        return {"ok": False, "exception": type(e).__name__, "message": str(e)}


async def main(url):
    report = {}
    progress, logs = [], []

    async def on_progress(value, total, message):
        progress.append([value, total, message])

    async def on_log(params):
        logs.append(str(params.data))

    info = lambda name: Implementation(name=name, version="1.0")
    async with Client(url, mode="legacy", client_info=info("agent-a"), logging_callback=on_log) as a, Client(
        url, mode="legacy", client_info=info("agent-b")
    ) as b:
        tools = await a.list_tools()
        report["tools"] = sorted(t.name for t in tools.tools)
        calls = {}
        for t in report["tools"]:
            kw = {"progress_callback": on_progress} if t == "progress" else {}
            calls[t] = await call(a, t, ARGS.get(t, {}), **kw)
        report["calls"] = calls
        report["progress"] = progress
        report["logs"] = logs
        refusal = None
        for i in range(100):
            answer = await call(a, "echo", {"text": f"storm-{i}"})
            if not answer["ok"]:
                refusal = answer
                refusal["after_calls"] = i + 1
                break
        report["refusal"] = refusal
        report["other_session"] = await call(b, "echo", {"text": "b"})
    print(json.dumps(report))


async def burst(url):
    async with Client(url, mode="legacy", client_info=Implementation(name="burst", version="1.0")) as c:
        answers = await asyncio.gather(*(call(c, "slow", {"ms": 300}) for _ in range(6)))
        stats = await call(c, "stats", {})
    print(json.dumps({"answers": answers, "stats": json.loads(stats["text"])}))


if __name__ == "__main__":
    if len(sys.argv) > 2 and sys.argv[2] == "burst":
        asyncio.run(burst(sys.argv[1]))
    else:
        asyncio.run(main(sys.argv[1]))
