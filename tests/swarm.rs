//! The swarm, in process: the example server (its real rmcp handler and its database of
//! 4 connections, a scan holding one 200 ms) behind the whole stack with
//! `examples/stormgate.toml` as shipped, on paused time; the agents of
//! `examples/storm/python_agents.py ... 16 swarm calm`: four steady agents (one `sql_scan` a
//! second), the calm complex agent (five tools round-robin, one call in flight, two a second),
//! and from 10 s a runaway of 16 searches over 8 sessions, each a new query, each retrying its
//! refusals 20 ms later whatever their `retry_after_ms`. Every call gives up after 1 s, as the
//! script's do. The same agents also speak MCP 2026-07-28 with a bearer token each (the
//! script's `stateless`).

mod common;

#[path = "../examples/mcp_server/app.rs"]
mod app;

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::Router;
use serde_json::{Value, json};
use stormgate::control::{Config, Control};
use tokio::time::Instant;
use tower::ServiceExt;

/// What one agent's calls ended as: "ok", "error", "timeout" or the refusal's reason.
type Outcomes = Arc<Mutex<BTreeMap<String, usize>>>;

/// Who an agent is: a legacy MCP session (its id), or a client of MCP 2026-07-28 (no session)
/// presenting a bearer token of its own, as `python_agents.py ... stateless` runs them.
#[derive(Clone)]
enum Agent {
    Session(String),
    Token(String),
}

impl Agent {
    /// A new agent on `router`: a session opened with `initialize`, or `name`'s token.
    async fn open(router: &Router, stateless: bool, name: &str) -> Agent {
        if stateless {
            Agent::Token(format!("token-of-{name}"))
        } else {
            Agent::Session(common::session(router).await)
        }
    }

    /// A `tools/call` of this agent.
    fn tool_call(&self, id: usize, tool: &str, args: Value) -> http::Request<axum::body::Body> {
        match self {
            Agent::Session(session) => common::tool_call(session, id, tool, args),
            Agent::Token(token) => http::Request::post("/mcp")
                .header("content-type", "application/json")
                .header("accept", "application/json, text/event-stream")
                .header("host", "localhost")
                .header("mcp-protocol-version", "2026-07-28")
                .header("mcp-method", "tools/call")
                .header("mcp-name", tool)
                .header("authorization", format!("Bearer {token}"))
                .body(axum::body::Body::from(
                    json!({"jsonrpc":"2.0","id":id,"method":"tools/call",
                        "params":{"name":tool,"arguments":args,"_meta":{
                            "io.modelcontextprotocol/protocolVersion":"2026-07-28",
                            "io.modelcontextprotocol/clientCapabilities":{},
                            "io.modelcontextprotocol/clientInfo":{"name":"agent","version":"1"}}}})
                    .to_string(),
                ))
                .unwrap(),
        }
    }
}

/// How one call ended, and the refusal's wait if it was refused.
async fn call(router: &Router, agent: &Agent, id: usize, tool: &str, args: Value) -> (String, u64) {
    let request = agent.tool_call(id, tool, args);
    let answer = tokio::time::timeout(Duration::from_secs(1), async {
        common::message(router.clone().oneshot(request).await.unwrap())
            .await
            .0
    })
    .await;
    let Ok(message) = answer else {
        return ("timeout".to_owned(), 0);
    };
    if let Some(reason) = message["error"]["data"]["reason"].as_str() {
        let wait = message["error"]["data"]["retry_after_ms"].as_u64().unwrap();
        return (reason.to_owned(), wait);
    }
    match message["result"]["isError"].as_bool() {
        Some(true) => ("error".to_owned(), 0),
        _ if message["result"].is_object() => ("ok".to_owned(), 0),
        _ => ("error".to_owned(), 0),
    }
}

fn count(outcomes: &Outcomes, outcome: &str) {
    *outcomes
        .lock()
        .unwrap()
        .entry(outcome.to_owned())
        .or_default() += 1;
}

/// A small deterministic generator for pauses and queries.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self
            .0
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        self.0 >> 33
    }

    /// A duration uniform in `[lo, hi]` ms.
    fn ms(&mut self, lo: u64, hi: u64) -> Duration {
        Duration::from_millis(lo + self.next() % (hi - lo + 1))
    }
}

async fn steady(router: Router, session: Agent, i: usize, end: Instant, outcomes: Outcomes) {
    let mut rng = Rng(i as u64);
    tokio::time::sleep(rng.ms(0, 1000)).await;
    let mut n = 0;
    while Instant::now() < end {
        n += 1;
        let args = json!({"table": "orders", "filter": format!("region = {i}")});
        let (outcome, wait) = call(&router, &session, n, "sql_scan", args).await;
        count(&outcomes, &outcome);
        let pause = rng.ms(900, 1100).max(Duration::from_millis(wait));
        tokio::time::sleep(pause).await;
    }
}

/// The complex agent: `callers` callers on one session, each pausing `pause` (ms, uniform)
/// after each answer.
async fn complex(
    router: Router,
    session: Agent,
    end: Instant,
    outcomes: Outcomes,
    callers: usize,
    pause: (u64, u64),
) {
    let callers = (0..callers).map(|w| {
        let (router, session, outcomes) = (router.clone(), session.clone(), outcomes.clone());
        tokio::spawn(complex_caller(
            router, session, w, callers, end, outcomes, pause,
        ))
    });
    for c in callers.collect::<Vec<_>>() {
        c.await.unwrap();
    }
}

async fn complex_caller(
    router: Router,
    session: Agent,
    w: usize,
    callers: usize,
    end: Instant,
    outcomes: Outcomes,
    pause: (u64, u64),
) {
    let mut rng = Rng(99 + w as u64);
    let mut n = w;
    while Instant::now() < end {
        let topic = rng.next() % 20;
        let (tool, args) = match n % 5 {
            0 => (
                "cache_get",
                json!({"key": format!("user:{}", rng.next() % 50)}),
            ),
            1 => (
                "vector_search",
                json!({"query": format!("design notes topic {topic}"), "top_k": 5}),
            ),
            2 => (
                "sql_scan",
                json!({"table": "reports", "filter": format!("quarter = {}", topic % 4)}),
            ),
            3 => (
                "read_doc",
                json!({"id": format!("doc-{}", rng.next() % 40)}),
            ),
            _ => (
                "create_order",
                json!({"item": format!("part-{topic}"), "quantity": 1}),
            ),
        };
        n += callers;
        let (outcome, wait) = call(&router, &session, n, tool, args).await;
        count(&outcomes, &outcome);
        let pause = rng.ms(pause.0, pause.1).max(Duration::from_millis(wait));
        tokio::time::sleep(pause).await;
    }
}

/// One of the runaway's searches: a new query each call, on `session` or (`fresh`) on a new
/// token each call.
async fn sub_agent_caller(
    router: Router,
    session: Agent,
    w: usize,
    end: Instant,
    outcomes: Outcomes,
    fresh: bool,
) {
    let mut rng = Rng(100 + w as u64);
    let mut n = 0;
    while Instant::now() < end {
        n += 1;
        let query = format!("body ilike '%{}%' /* {w} {n} */", rng.next() % 100_000);
        let args = json!({"table": "documents", "filter": query});
        let session = match fresh {
            true => &Agent::Token(format!("token-of-runaway-{w}-{n}")),
            false => &session,
        };
        let (outcome, _) = call(&router, session, n, "sql_scan", args).await;
        count(&outcomes, &outcome);
        match outcome.as_str() {
            "ok" => tokio::time::sleep(rng.ms(200, 600)).await,
            "error" | "timeout" => {}
            _ => tokio::time::sleep(Duration::from_millis(20)).await,
        }
    }
}

/// What each group of agents' calls ended as, and the sub-agents' factors each second from
/// the swarm's start (`None` while a sub-agent waits in its tenant's unverified pool, and for
/// stateless ones, whose sessions are keyed hashes of their tokens).
struct Figures {
    steady: BTreeMap<String, usize>,
    complex: BTreeMap<String, usize>,
    swarm: BTreeMap<String, usize>,
    factors: Vec<Vec<Option<f64>>>,
}

/// The example server behind the whole stack, `examples/stormgate.toml` as shipped.
fn server() -> (Router, Control) {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/examples/stormgate.toml");
    let config = Config::load(std::path::Path::new(path)).unwrap();
    let (router, control) = app::protected(app::Backend::new(), config).unwrap();
    let _ = control.spawn();
    (router, control)
}

/// When the runaway starts, as the runs start it.
const SWARM_AT: Duration = Duration::from_secs(10);

/// Runs the agents for 60 s, the complex agent with `callers` callers each pausing `pause`.
async fn run(callers: usize, pause: (u64, u64)) -> Figures {
    let (router, control) = server();
    agents(
        &router,
        &control,
        Scenario::Swarm,
        callers,
        pause,
        Start::After(SWARM_AT),
    )
    .await
}

/// When the runaway starts.
#[derive(Clone, Copy, PartialEq)]
enum Start {
    /// This long after the other agents opened their sessions.
    After(Duration),
    /// With them, its sessions opened before theirs (an orchestrator started first: over
    /// real HTTP, who opens first is a matter of chance).
    First,
}

/// How the agents speak and how the runaway's searches are spread.
#[derive(Clone, Copy, PartialEq)]
enum Scenario {
    /// Legacy sessions; the runaway over 8 sessions.
    Swarm,
    /// MCP 2026-07-28, a bearer token per agent; the runaway one token (its 16 searches).
    Stateless,
    /// As `Stateless`, but the runaway presents a new token on every call.
    FreshToken,
}

/// 60 s of the agents on `router`, as `python_agents.py ... 60 <runaway_at> 16 <scenario>`
/// runs them (agents named as the script names them, so tokens are the script's).
async fn agents(
    router: &Router,
    control: &Control,
    scenario: Scenario,
    callers: usize,
    pause: (u64, u64),
    start: Start,
) -> Figures {
    let stateless = scenario != Scenario::Swarm;
    let end = Instant::now() + Duration::from_secs(60);
    let mut sessions = Vec::new();
    let open_runaway = async || {
        let mut sessions = Vec::new();
        for i in 0..if stateless { 1 } else { 8 } {
            sessions.push(Agent::open(router, stateless, &format!("runaway-{i}")).await);
        }
        sessions
    };
    if start == Start::First {
        sessions = open_runaway().await;
    }
    let (steadies, complex_, swarm) = (
        Outcomes::default(),
        Outcomes::default(),
        Outcomes::default(),
    );
    let mut tasks = Vec::new();
    for i in 0..4 {
        let agent = Agent::open(router, stateless, &format!("steady-{i}")).await;
        tasks.push(tokio::spawn(steady(
            router.clone(),
            agent,
            i,
            end,
            steadies.clone(),
        )));
    }
    let agent = Agent::open(router, stateless, "complex").await;
    tasks.push(tokio::spawn(complex(
        router.clone(),
        agent,
        end,
        complex_.clone(),
        callers,
        pause,
    )));
    if let Start::After(wait) = start {
        tokio::time::sleep(wait).await;
        sessions = open_runaway().await;
    }
    for w in 0..16 {
        let (router, session) = (router.clone(), sessions[w % sessions.len()].clone());
        tasks.push(tokio::spawn(sub_agent_caller(
            router,
            session,
            w,
            end,
            swarm.clone(),
            scenario == Scenario::FreshToken,
        )));
    }
    let mut factors = Vec::new();
    while Instant::now() < end {
        tokio::time::sleep(Duration::from_secs(1)).await;
        let guard = control.sessions();
        let factor = |s: &Agent| match s {
            Agent::Session(s) => guard
                .summary(&stormgate::SessionId::new(s.as_str()))
                .map(|s| s.factor),
            Agent::Token(_) => None,
        };
        factors.push(sessions.iter().map(factor).collect());
    }
    for t in tasks {
        t.await.unwrap();
    }
    let figures = |o: &Outcomes| o.lock().unwrap().clone();
    Figures {
        steady: figures(&steadies),
        complex: figures(&complex_),
        swarm: figures(&swarm),
        factors,
    }
}

/// The calls refused (outcomes other than "ok", "error" and "timeout").
fn refused(o: &BTreeMap<String, usize>) -> usize {
    o.iter()
        .filter(|(k, _)| !["ok", "error", "timeout"].contains(&k.as_str()))
        .map(|(_, n)| n)
        .sum()
}

/// The agents for 60 s on a new server, the runaway starting with the others.
async fn from_the_start(scenario: Scenario) -> Figures {
    let (router, control) = server();
    let start = Start::After(Duration::ZERO);
    agents(&router, &control, scenario, 1, (500, 500), start).await
}

/// Each innocent agent refused at most twice (in all: the four steady agents 8 times, the
/// complex one 2): its first call, when its tenant's unverified pool already refuses (nothing
/// tells a new client's first call from a made-up id's), and once more if it comes back
/// before a newcomer place is free.
fn refused_at_most_twice(f: &Figures) {
    assert!(
        refused(&f.steady) <= 2 * 4 && refused(&f.complex) <= 2,
        "steady {:?}, complex {:?}, runaway {:?}",
        f.steady,
        f.complex,
        f.swarm
    );
}

/// No call of an innocent agent ended otherwise than "ok" in `run` run.
#[track_caller]
fn refused_never(run: &str, f: &Figures) {
    assert_eq!(
        (not_ok(&f.steady), not_ok(&f.complex)),
        (vec![], vec![]),
        "{run} run: steady {:?}, complex {:?}, runaway {:?}",
        f.steady,
        f.complex,
        f.swarm
    );
}

/// The outcomes other than "ok".
fn not_ok(o: &BTreeMap<String, usize>) -> Vec<(String, usize)> {
    o.iter()
        .filter(|(k, _)| *k != "ok")
        .map(|(k, n)| (k.clone(), *n))
        .collect()
}

/// Steady agents are never refused beside the swarm, nor the calm complex agent; the swarm
/// is, and is scored. Before a full database queue refused the excess instead of whoever came
/// last, 13 of 177 steady calls and 5 of 106 complex ones were refused `queue_full`.
#[tokio::test(start_paused = true)]
async fn a_swarm_of_sixteen_searches_over_eight_sessions_refuses_nobody_else() {
    let Figures {
        steady,
        complex,
        swarm,
        factors,
    } = run(1, (500, 500)).await;
    assert_eq!(
        (not_ok(&steady), not_ok(&complex)),
        (vec![], vec![]),
        "steady {steady:?}, complex {complex:?}, swarm {swarm:?}"
    );
    // Scored: most sub-agents end at the storm floor (2% of their budget); the rest, alone
    // once the others are cut, are no longer refused and have nothing to score.
    let end = factors.last().unwrap();
    let cut = end.iter().filter(|f| f.is_some_and(|f| f <= 0.02)).count();
    assert!(cut >= 4, "sub-agents' factors at the end: {end:?}");
    assert!(
        swarm.get("session_storm").copied().unwrap_or(0) > 0,
        "the swarm is refused for its score: {swarm:?}"
    );
    // The database (20 scans a second) runs most of what the others leave: 582 scans here,
    // 673 before the sub-agents still waiting in their tenant's pool were charged to its early
    // state when they call before their waits (and cut there as the swarm they are).
    let scans = swarm.get("ok").copied().unwrap_or(0);
    assert!(scans >= 550, "the swarm's scans: {swarm:?}");
}

/// With the script's default complex agent (two callers, a call every 150-350 ms each: about
/// 195 units/s, as much as a sub-agent asks) the steady agents are still never refused. The
/// busy agent is, a few times (9 of 363, `global_budget_exceeded`): once the last sub-agents
/// leave their tenant's unverified pool the budget is contended, the busy agent is as far
/// above its max-min fair part as each sub-agent, and it shares their refusals until their
/// score cuts them, about 7 s later (see docs/results.md).
#[tokio::test(start_paused = true)]
async fn beside_a_busier_complex_agent_the_steady_agents_are_still_never_refused() {
    let Figures { steady, swarm, .. } = run(2, (150, 350)).await;
    assert_eq!(not_ok(&steady), [], "steady {steady:?}, swarm {swarm:?}");
}

/// One client's burst, read as within its share (a client known for a while asking sixteen
/// scans at once: its demand over the budget's memory is modest), fills the database's queue;
/// a steady agent's scan arriving after it takes the place of the burst's newest waiter
/// instead of being refused. (Over real HTTP a stateless runaway's first burst did this while
/// its token was still its tenant's unverified pool: 1 steady call of 199 refused.) The steady
/// agent is the only other client and within its share: a client alone asks no more than its
/// fair part.
#[tokio::test(start_paused = true)]
async fn a_burst_that_fills_the_queue_does_not_refuse_a_steady_agent_after_it() {
    let (router, _control) = server();
    let steady = Agent::Session(common::session(&router).await);
    let bursty = Agent::Session(common::session(&router).await);
    let scan = |n: usize| json!({"table": "orders", "filter": format!("region = {n}")});
    assert_eq!(
        call(&router, &bursty, 1, "cache_get", json!({"key": "a"}))
            .await
            .0,
        "ok"
    );
    let mut refusals = Vec::new();
    for n in 0..8 {
        refusals.push(call(&router, &steady, n, "sql_scan", scan(0)).await.0);
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
    let burst: Vec<_> = (0..16)
        .map(|n| {
            let (router, bursty) = (router.clone(), bursty.clone());
            tokio::spawn(async move { call(&router, &bursty, 100 + n, "sql_scan", scan(n)).await })
        })
        .collect();
    tokio::time::sleep(Duration::from_millis(10)).await;
    refusals.push(call(&router, &steady, 8, "sql_scan", scan(0)).await.0);
    let mut burst_outcomes = BTreeMap::<String, usize>::new();
    for b in burst {
        *burst_outcomes.entry(b.await.unwrap().0).or_default() += 1;
    }
    refusals.retain(|o| o != "ok");
    assert_eq!(refusals, Vec::<String>::new(), "burst: {burst_outcomes:?}");
    assert!(
        burst_outcomes.get("queue_full").is_some_and(|&n| n > 0),
        "the burst gave a place up: {burst_outcomes:?}"
    );
}

/// A swarm, then at once the stateless agents of `python_agents.py ... 16 stateless calm` on
/// the same server: the new clients of the tenant the swarm stormed in are never refused for
/// it. Over real HTTP the stateless steady agents were refused `session_storm` in 3 of 11
/// such sequences before trial calls (62 ok and 12 refused where 199 is normal). Once the
/// newcomer places went only to ids that come back as told, the sub-agents (which never do)
/// stayed in the tenant's unverified pool and kept it storming, and 6 of 188 steady calls
/// were refused here; their calls before their waits are now charged to the pool's early
/// state, so the pool the new clients are charged to is calm.
#[tokio::test(start_paused = true)]
async fn after_a_swarm_new_stateless_clients_of_its_tenant_are_never_refused() {
    let (router, control) = server();
    let start = Start::After(SWARM_AT);
    let first = agents(&router, &control, Scenario::Swarm, 1, (500, 500), start).await;
    let second = agents(&router, &control, Scenario::Stateless, 1, (500, 500), start).await;
    for (run, f) in [("the swarm's", &first), ("the stateless agents'", &second)] {
        refused_never(run, f);
    }
    let swarm = &second.swarm;
    assert!(
        swarm.values().sum::<usize>() > swarm.get("ok").copied().unwrap_or(0) * 4,
        "the runaway is refused: {swarm:?}"
    );
}

/// The runaway starts with the other agents, all new clients of one tenant (the example's
/// `anonymous`): the runaway's 8 sessions wait for newcomer places beside one steady agent
/// and the complex one, in the tenant's unverified pool, judged as one client with them. None
/// of the innocents is refused. Before a call could take the place of a waiter of the pool's
/// id holding the most places (running or waiting), a steady agent's first scan found the
/// database's queue full of the sub-agents' and was refused `queue_full`, and the pool,
/// stormed meanwhile, refused its next call `session_storm`: steady 198 ok and 2 refused,
/// complex 104 and 2.
#[tokio::test(start_paused = true)]
async fn a_swarm_starting_with_the_other_agents_refuses_nobody_else() {
    refused_never("the", &from_the_start(Scenario::Swarm).await);
}

/// The runaway starts with the other agents and presents a new token on every call
/// (`python_agents.py ... 60 0 16 fresh-token calm`): ids made up per call, all new clients
/// of one tenant with the stateless agents. Before, the made-up ids took every newcomer place
/// (3 at once, then each as it refilled), and the steady agents were refused on every call
/// (0 ok, 18 refused, told up to 35 s); now the places go to the agents that come back as
/// told, and they are refused at most twice each (182 ok, 6 refused).
#[tokio::test(start_paused = true)]
async fn new_tokens_per_call_starting_with_the_other_agents_refuse_them_at_most_twice() {
    let figures = from_the_start(Scenario::FreshToken).await;
    refused_at_most_twice(&figures);
    // Answered (none was before): the agents that come back before a place is free wait
    // for one, about 10 s, so they make fewer calls than the run's 4 x 60.
    let steady = &figures.steady;
    assert!(
        steady.get("ok").copied().unwrap_or(0) >= 4 * 40,
        "the steady agents' calls are answered: {steady:?}"
    );
}

/// The runaway opens its 8 sessions first and starts with the other agents: three
/// sub-agents take the tenant's newcomer places before any innocent asks, and the innocents
/// wait for places in the unverified pool with the other five. They are refused at most twice
/// each; here the steady agents 2 calls of 192 (a first scan `queue_full`, a second
/// `session_budget_exceeded` while no newcomer place was free), the complex agent none.
/// Before a call could take the place of a waiter of its pool's id holding the most, 4 of 186
/// and 1 of 106.
#[tokio::test(start_paused = true)]
async fn a_swarm_that_opened_its_sessions_first_refuses_the_others_at_most_twice() {
    let (router, control) = server();
    let start = Start::First;
    let f = agents(&router, &control, Scenario::Swarm, 1, (500, 500), start).await;
    refused_at_most_twice(&f);
}
