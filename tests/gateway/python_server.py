"""An upstream MCP server for tests/gateway.rs, on the official Python SDK (`mcp`, pinned in
.ci/run): MCPServer (FastMCP's successor in mcp 2) over streamable HTTP on a free loopback
port, which it prints on stdout as `PORT <n>` once it accepts connections.

Tools: `echo` (cheap), `slow` (holds one of two pool places for `ms` milliseconds),
`progress` (sends a progress notification and a log message per step, then answers), and
`stats` (the pool's counters).

usage: python_server.py
"""

import asyncio
import logging
import socket
import sys
import warnings

import uvicorn
from mcp.server.mcpserver import Context, MCPServer

# The SDK warns that logging is deprecated as of 2026-07-28; this server sends log messages on
# purpose (handshake-era clients still read them). Its INFO logs would only clutter test output.
warnings.filterwarnings("ignore", message=".*deprecated.*")
logging.basicConfig(level=logging.WARNING)

POOL_SIZE = 2
pool = asyncio.Semaphore(POOL_SIZE)
counters = {"slow_started": 0, "slow_finished": 0, "slow_cancelled": 0, "in_pool": 0}

server = MCPServer("gateway-upstream-python")


@server.tool()
async def echo(text: str) -> str:
    """Answers with its argument at once."""
    return text


@server.tool()
async def slow(ms: int = 200) -> str:
    """Holds one of the pool's places for `ms` milliseconds."""
    counters["slow_started"] += 1
    try:
        async with pool:
            counters["in_pool"] += 1
            try:
                await asyncio.sleep(ms / 1000)
            finally:
                counters["in_pool"] -= 1
    except asyncio.CancelledError:
        counters["slow_cancelled"] += 1
        raise
    counters["slow_finished"] += 1
    return f"slept {ms} ms"


@server.tool()
async def progress(steps: int, ctx: Context) -> str:
    """Sends one progress notification and one log message per step."""
    for i in range(steps):
        await ctx.report_progress(i + 1, steps, f"step {i + 1}")
        await ctx.info(f"step {i + 1} of {steps}")
        await asyncio.sleep(0.02)
    return f"{steps} steps"


@server.tool()
async def stats() -> dict:
    """The slow tool's counters."""
    return dict(counters)


async def main():
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", 0))
    sock.listen(128)
    port = sock.getsockname()[1]
    app = server.streamable_http_app(streamable_http_path="/mcp")
    config = uvicorn.Config(app, log_level="warning", lifespan="on")
    uv = uvicorn.Server(config)
    task = asyncio.create_task(uv.serve(sockets=[sock]))
    while not uv.started:
        if task.done():
            task.result()
            sys.exit(1)
        await asyncio.sleep(0.01)
    print(f"PORT {port}", flush=True)
    await task


if __name__ == "__main__":
    asyncio.run(main())
