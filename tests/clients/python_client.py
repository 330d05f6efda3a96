"""Drives a stormgate-protected MCP server with the official Python SDK (`mcp`, pinned in
.ci/run) and prints one JSON report on stdout for tests/clients.rs to assert on.

usage: python_client.py URL MODE    (MODE: "legacy" or a modern revision such as "2026-07-28")

Two independent clients A and B (two agents, declaring different names) connect. A lists the tools and calls each once, then storms
`cache_get` until it is refused; the report says what the SDK surfaced (exception type, code,
message, data; or the tool result's text and structured content). B then calls once; then A
waits the retry hint and calls again.
"""

import asyncio
import json
import sys

from mcp import Client
from mcp.shared.exceptions import MCPError
from mcp_types import Implementation

ARGS = {
    "cache_get": {"key": "k"},
    "vector_search": {"query": "weather"},
    "sql_scan": {"table": "orders"},
    "read_doc": {"id": "d1"},
    "create_order": {"item": "pen", "quantity": 1},
}


def result_of(r):
    text = r.content[0].text if r.content else None
    return {
        "ok": not r.is_error,
        "is_error": bool(r.is_error),
        "text": text,
        "structured": r.structured_content,
    }


async def call(client, name, args):
    try:
        return result_of(await client.call_tool(name, args))
    except MCPError as e:
        return {
            "ok": False,
            "exception": type(e).__name__,
            "code": e.code,
            "message": e.message,
            "data": e.data,
        }
    except Exception as e:  # anything else the SDK raises is reported, not hidden
        return {"ok": False, "exception": type(e).__name__, "message": str(e)}


async def main(url, mode):
    report = {"mode": mode}
    # Two different agents: they declare different names, the only thing that tells them apart
    # on the session-less protocol (2026-07-28) when they run on one host.
    info = lambda name: Implementation(name=name, version="1.0")
    async with Client(url, mode=mode, client_info=info("agent-a")) as a, Client(
        url, mode=mode, client_info=info("agent-b")
    ) as b:
        tools = await a.list_tools()
        report["tools"] = sorted(t.name for t in tools.tools)
        report["calls"] = {t: await call(a, t, ARGS.get(t, {})) for t in report["tools"]}
        refusal = None
        for i in range(100):
            answer = await call(a, "cache_get", {"key": f"storm-{i}"})
            if not answer["ok"]:
                refusal = answer
                refusal["after_calls"] = i + 1
                break
        report["refusal"] = refusal
        report["other_client"] = await call(b, "cache_get", {"key": "b"})
        if refusal is not None:
            data = refusal.get("data") or refusal.get("structured") or {}
            wait = data.get("retryAfterMs", data.get("retry_after_ms", 0)) / 1000.0
            await asyncio.sleep(wait)
            report["after_waiting"] = await call(a, "cache_get", {"key": "again"})
    print(json.dumps(report))


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], sys.argv[2]))
