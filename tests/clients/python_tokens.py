"""Two stateless agents of the same SDK on one host, each presenting its own bearer token
(`Authorization: Bearer ...`), through the official Python SDK (`mcp`, pinned in .ci/run) in a
session-less protocol mode. A storms `cache_get` until it is refused; then B (same declared
name, another token) calls once. Prints one JSON report on stdout for tests/clients.rs.

usage: python_tokens.py URL MODE    (MODE: a modern revision such as "2026-07-28")
"""

import asyncio
import json
import sys

from mcp import Client
from mcp.client.streamable_http import streamable_http_client
from mcp.shared._httpx_utils import create_mcp_http_client
from mcp.shared.exceptions import MCPError
from mcp_types import Implementation


def agent(url, mode, token):
    http = create_mcp_http_client(headers={"Authorization": f"Bearer {token}"})
    transport = streamable_http_client(url, http_client=http)
    # The same declared name for both: only the token tells them apart.
    return Client(transport, mode=mode, client_info=Implementation(name="agent", version="1.0"))


async def call(client, name, args):
    try:
        r = await client.call_tool(name, args)
        return {"ok": not r.is_error}
    except MCPError as e:
        return {"ok": False, "code": e.code, "message": e.message, "data": e.data}
    except Exception as e:  # anything else the SDK raises is reported, not hidden
        return {"ok": False, "exception": type(e).__name__, "message": str(e)}


async def main(url, mode):
    report = {"mode": mode}
    async with agent(url, mode, "token-of-a") as a, agent(url, mode, "token-of-b") as b:
        report["first_b"] = await call(b, "cache_get", {"key": "b0"})
        refusal = None
        for i in range(100):
            answer = await call(a, "cache_get", {"key": f"storm-{i}"})
            if not answer["ok"]:
                refusal = answer
                refusal["after_calls"] = i + 1
                break
        report["refusal"] = refusal
        report["other_client"] = [await call(b, "cache_get", {"key": f"b{i}"}) for i in range(1, 4)]
    print(json.dumps(report))


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], sys.argv[2]))
