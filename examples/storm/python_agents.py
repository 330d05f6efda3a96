"""The storm demo's agents over real HTTP, with the official Python MCP SDK (`mcp`, the version
.ci/run pins): four steady agents (one `sql_scan` a second), a complex agent (five tools
round-robin, two calls in flight; or, COMPLEX "calm", one call in flight, two a second), and
from RUNAWAY_AT seconds a runaway (WORKERS parallel
searches, a new query each, errors and timeouts retried at once, refusals after their
`retry_after_ms`). Every call gives up after 1 s. Prints each agent's outcomes as JSON.

SCENARIO (default "storm") as in the storm demo:
  storm      every agent one legacy MCP session; the runaway waits its refusals' hints
  swarm      the runaway's searches spread over 8 sessions, each retrying its refusals 20 ms
             later, ignoring `retry_after_ms`
  stateless  every agent speaks MCP 2026-07-28 (no session) with a bearer token of its own;
             the runaway retries its refusals 20 ms later, ignoring `retry_after_ms`
  fresh      as storm, but the runaway opens a new session (an `initialize`) for every call;
             compare its admitted calls ("ok") with storm's
  fresh-token  as stateless, but the runaway presents a new bearer token on every call;
             compare its admitted calls with stateless's

usage: python_agents.py URL SECONDS RUNAWAY_AT WORKERS [SCENARIO [COMPLEX]]
  e.g. against `cargo run --release --example mcp_server` (examples/stormgate.toml):
  python_agents.py http://127.0.0.1:3000/mcp 60 10 8 swarm
Real clock, real sockets: figures vary from run to run (the README quotes runs).
"""
import asyncio, json, random, sys, time
from mcp import Client
from mcp.client.streamable_http import streamable_http_client
from mcp.shared._httpx_utils import create_mcp_http_client
from mcp.shared.exceptions import MCPError
from mcp_types import Implementation

URL = sys.argv[1]
DUR = float(sys.argv[2])
RUNAWAY_AT = float(sys.argv[3])
WORKERS = int(sys.argv[4])
SCENARIO = sys.argv[5] if len(sys.argv) > 5 else "storm"
assert SCENARIO in ("storm", "swarm", "stateless", "fresh", "fresh-token"), SCENARIO
COMPLEX = sys.argv[6] if len(sys.argv) > 6 else "busy"
assert COMPLEX in ("busy", "calm"), COMPLEX
# The runaway retries its refusals 20 ms later instead of after their hint.
IGNORES_HINTS = SCENARIO not in ("storm", "fresh")
# The runaway's identity is new on every call.
FRESH = SCENARIO.startswith("fresh")
STATELESS = SCENARIO in ("stateless", "fresh-token")
stats = {}
T0 = time.monotonic()

def rec(agent, kind):
    a = stats.setdefault(agent, {})
    a[kind] = a.get(kind, 0) + 1

async def call(c, agent, name, args, timeout=1.0):
    try:
        r = await asyncio.wait_for(c.call_tool(name, args), timeout)
        rec(agent, "error" if r.is_error else "ok")
        return ("error" if r.is_error else "ok", 0)
    except MCPError as e:
        if e.code in (-32029, 429):  # 429 from MCP 2026-07-28 on
            d = e.data or {}
            rec(agent, "refused:" + str(d.get("reason")))
            return ("refused", d.get("retry_after_ms", 1000) / 1000)
        rec(agent, f"err{e.code}")
        return ("error", 0)
    except asyncio.TimeoutError:
        rec(agent, "timeout")
        return ("timeout", 0)

def client(name):
    info = Implementation(name=name, version="1")
    if STATELESS:
        http = create_mcp_http_client(headers={"Authorization": f"Bearer token-of-{name}"})
        transport = streamable_http_client(URL, http_client=http)
        return Client(transport, mode="2026-07-28", client_info=info)
    return Client(URL, mode="legacy", client_info=info)

async def steady(i):
    async with client(f"steady-{i}") as c:
        await asyncio.sleep(random.random())
        while time.monotonic() - T0 < DUR:
            o, wait = await call(c, "steady", "sql_scan", {"table": "orders", "filter": f"region = {i}"})
            await asyncio.sleep(max(wait, random.uniform(0.9, 1.1)))

async def complex_agent():
    async with client("complex") as c:
        async def worker(w):
            n = w
            rng = random.Random(w)
            while time.monotonic() - T0 < DUR:
                k = n % 5
                topic = rng.randrange(20)
                name, args = [
                    ("cache_get", {"key": f"user:{rng.randrange(50)}"}),
                    ("vector_search", {"query": f"design notes topic {topic}", "top_k": 5}),
                    ("sql_scan", {"table": "reports", "filter": f"quarter = {topic % 4}"}),
                    ("read_doc", {"id": f"doc-{rng.randrange(40)}"}),
                    ("create_order", {"item": f"part-{topic}", "quantity": 1}),
                ][k]
                n += callers
                o, wait = await call(c, "complex", name, args)
                await asyncio.sleep(max(wait, pause(rng)))
        callers = 2 if COMPLEX == "busy" else 1
        pause = (lambda rng: rng.uniform(0.15, 0.35)) if COMPLEX == "busy" else (lambda rng: 0.5)
        await asyncio.gather(*(worker(w) for w in range(callers)))

WORDS = "latency context pool tenant storm retry budget agent queue entropy cache index shard replica vacuum planner".split()

async def runaway():
    await asyncio.sleep(RUNAWAY_AT)
    sessions = 8 if SCENARIO == "swarm" else 1
    clients = [client(f"runaway-{i}") for i in range(sessions)]
    for c in clients:
        await c.__aenter__()

    async def worker(w):
        c = clients[w % sessions]
        rng = random.Random(100 + w)
        n = 0
        while time.monotonic() - T0 < DUR:
            q = f"body ilike '%{' '.join(rng.choice(WORDS) for _ in range(3))}%' /* {rng.randrange(100000)} */"
            args = {"table": "documents", "filter": q}
            if FRESH:
                n += 1
                try:
                    async with client(f"runaway-{w}-{n}") as fresh:
                        o, wait = await call(fresh, "runaway", "sql_scan", args)
                except Exception as e:  # the session's opening refused or failed
                    while isinstance(e, ExceptionGroup) and e.exceptions:
                        e = e.exceptions[0]
                    if isinstance(e, MCPError) and e.code in (-32029, 429):
                        rec("runaway", "refused:initialize")
                        o, wait = "refused", (e.data or {}).get("retry_after_ms", 1000) / 1000
                    else:
                        rec("runaway", "initialize failed")
                        o, wait = "error", 0.02
            else:
                o, wait = await call(c, "runaway", "sql_scan", args)
            if o == "ok":
                await asyncio.sleep(rng.uniform(0.2, 0.6))
            elif o == "refused":
                await asyncio.sleep(0.02 if IGNORES_HINTS else wait)
    try:
        await asyncio.gather(*(worker(w) for w in range(WORKERS)))
    finally:
        for c in reversed(clients):
            await c.__aexit__(None, None, None)

async def main():
    random.seed(7)
    await asyncio.gather(*(steady(i) for i in range(4)), complex_agent(), runaway())
    print(json.dumps(stats, sort_keys=True))

asyncio.run(main())
