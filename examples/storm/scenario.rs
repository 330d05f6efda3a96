//! The storm scenario (seed 003 section 1): steady agents, one complex but healthy agent and one
//! runaway agent share the example server's database pool, under one protection policy.
//!
//! Every agent is rmcp's own client speaking streamable HTTP to the example server's real
//! rmcp service through the whole axum stack ([`crate::inprocess`]); the scenario runs on
//! tokio's clock, so under `start_paused` a run of minutes takes seconds and a seed gives the
//! same numbers every time. Shared by `examples/storm` (the demo) and `tests/storm.rs` (the
//! goals as assertions).

#![allow(dead_code)] // the test reads fewer fields than the demo prints

use std::sync::{Arc, Mutex};
use std::time::Duration;

use rmcp::model::{CallToolRequestParams, ClientConfig};
use rmcp::service::{RoleClient, RunningService, ServiceError};
use rmcp::transport::StreamableHttpClientTransport;
use rmcp::transport::streamable_http_client::StreamableHttpClientTransportConfig;
use rmcp::{ServiceExt, model::CallToolResult};
use serde_json::{Value, json};
use stormgate::control::{Config, Control};
use stormgate::{Reason, SessionId};
use tokio::time::Instant;

use crate::app::{self, Backend};
use crate::inprocess::InProcess;

/// The stormgate configuration of the demo's adaptive policy.
pub(crate) const STORMGATE_TOML: &str = include_str!("stormgate.toml");

/// Tenant header every agent's client sends (the demo's agents are separate customers).
const TENANT_HEADER: &str = "x-tenant";

/// A protection policy.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Policy {
    /// No protection: the stack in `off` mode.
    Off,
    /// A plain fixed rate limit of this many calls per second per session (the stack in
    /// `fixed` mode with only `session_rate`, every tool weighing 1, no resource limits).
    Fixed(u32),
    /// stormgate in `adaptive` mode with `stormgate.toml`.
    Stormgate,
}

impl Policy {
    /// The policies, in the order the demo runs them: a fixed limit set where it spares the
    /// complex agent (8/s, above its peak), and one set where it stops the runaway (2/s).
    pub(crate) const ALL: [Policy; 4] = [
        Policy::Off,
        Policy::Fixed(8),
        Policy::Fixed(2),
        Policy::Stormgate,
    ];

    /// Its name in the table.
    pub(crate) fn name(self) -> String {
        match self {
            Policy::Off => "off".into(),
            Policy::Fixed(rate) => format!("fixed {rate}/s per session"),
            Policy::Stormgate => "stormgate adaptive".into(),
        }
    }

    /// The stack's configuration under this policy.
    pub(crate) fn config(self) -> Config {
        let text = match self {
            Policy::Off => STORMGATE_TOML.replace("mode = \"adaptive\"", "mode = \"off\""),
            Policy::Fixed(rate) => format!(
                "mode = \"fixed\"\n[identity]\ntenant_header = \"{TENANT_HEADER}\"\n\
                 [features]\nresource_limits = false\n\
                 [fixed]\nsession_rate = {rate}.0\n"
            ),
            Policy::Stormgate => STORMGATE_TOML.to_owned(),
        };
        Config::from_toml(&text).expect("the demo's configurations are valid")
    }
}

/// What the run does: its length, when the runaway starts, and the seed of every random
/// choice (think times, query words).
#[derive(Debug, Clone, Copy)]
pub(crate) struct Settings {
    /// The seed.
    pub(crate) seed: u64,
    /// How long the whole run lasts.
    pub(crate) duration: Duration,
    /// When the runaway agent starts (the others start at once).
    pub(crate) runaway_start: Duration,
    /// Steady agents.
    pub(crate) steady_agents: usize,
}

impl Default for Settings {
    fn default() -> Self {
        Settings {
            seed: 7,
            duration: Duration::from_secs(180),
            runaway_start: Duration::from_secs(30),
            steady_agents: 4,
        }
    }
}

/// How a call ended, as its agent saw it.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) enum Outcome {
    /// A result.
    Ok,
    /// A tool error result or another JSON-RPC error.
    Error,
    /// The agent gave up waiting.
    Timeout,
    /// Refused with `-32029 rate_limited`; the agent waits `retry_after`.
    Throttled {
        /// `data.retry_after_ms`.
        retry_after: Duration,
        /// `data.reason`.
        reason: Option<Reason>,
    },
}

/// One call an agent made.
#[derive(Debug, Clone, Copy)]
pub(crate) struct CallRecord {
    /// Which agent.
    pub(crate) agent: Agent,
    /// When it was sent, from the start of the run.
    pub(crate) at: Duration,
    /// How long until the agent had its answer (or gave up).
    pub(crate) latency: Duration,
    /// How it ended.
    pub(crate) outcome: Outcome,
}

/// The kinds of agent.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Agent {
    /// One tool, similar arguments, one call a second.
    Steady,
    /// Five tools round-robin, two in flight, no errors.
    Complex,
    /// The seed's runaway: one search tool, ever-new queries, retries on every error and
    /// timeout, more parallel searches as it goes.
    Runaway,
}

/// One sample of the run's state, every [`SAMPLE_EVERY`].
#[derive(Debug, Clone, Copy)]
pub(crate) struct Sample {
    /// From the start of the run.
    pub(crate) at: Duration,
    /// The global budget, cost units per second.
    pub(crate) budget: f64,
    /// The runaway's storm score (0 before it starts).
    pub(crate) runaway_score: f64,
    /// Longest pool wait of the scans that arrived since the last sample.
    pub(crate) pool_wait: Duration,
}

/// How often the state is sampled for the chart.
pub(crate) const SAMPLE_EVERY: Duration = Duration::from_millis(500);

/// Everything one run measured.
#[derive(Debug, Clone)]
pub(crate) struct Report {
    /// The policy.
    pub(crate) policy: Policy,
    /// Every call every agent made.
    pub(crate) calls: Vec<CallRecord>,
    /// Every scan the database ran or failed.
    pub(crate) scans: Vec<app::Scan>,
    /// The state over time.
    pub(crate) samples: Vec<Sample>,
    /// The run's settings.
    pub(crate) settings: Settings,
}

/// Per-agent-kind figures.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct AgentStats {
    /// Calls made.
    pub(crate) calls: usize,
    /// Calls answered with a result.
    pub(crate) ok: usize,
    /// Calls refused by the policy.
    pub(crate) throttled: usize,
    /// Calls that failed or timed out.
    pub(crate) failed: usize,
    /// Results per second over the agent's active time.
    pub(crate) goodput: f64,
    /// 99th percentile latency of the calls that were not refused.
    pub(crate) p99: Duration,
}

impl Report {
    /// Database scans that took longer than [`app::SLOW_QUERY`], pool wait included.
    pub(crate) fn slow_queries(&self) -> usize {
        self.scans
            .iter()
            .filter(|s| s.total > app::SLOW_QUERY)
            .count()
    }

    /// Figures of one agent kind.
    pub(crate) fn stats(&self, agent: Agent) -> AgentStats {
        let calls: Vec<&CallRecord> = self.calls.iter().filter(|c| c.agent == agent).collect();
        let mut s = AgentStats {
            calls: calls.len(),
            ..Default::default()
        };
        let mut latencies = Vec::new();
        for c in &calls {
            match c.outcome {
                Outcome::Ok => s.ok += 1,
                Outcome::Throttled { .. } => s.throttled += 1,
                Outcome::Error | Outcome::Timeout => s.failed += 1,
            }
            if !matches!(c.outcome, Outcome::Throttled { .. }) {
                latencies.push(c.latency);
            }
        }
        latencies.sort();
        if !latencies.is_empty() {
            let i = ((latencies.len() as f64 * 0.99).ceil() as usize).clamp(1, latencies.len());
            s.p99 = latencies[i - 1];
        }
        let active = match agent {
            Agent::Runaway => self.settings.duration - self.settings.runaway_start,
            _ => self.settings.duration,
        };
        s.goodput = s.ok as f64 / active.as_secs_f64();
        s
    }

    /// Refusals of `agent`'s calls by reason, most frequent first.
    pub(crate) fn refusals(&self, agent: Agent) -> Vec<(String, usize)> {
        let mut counts: Vec<(String, usize)> = Vec::new();
        for c in self.calls.iter().filter(|c| c.agent == agent) {
            if let Outcome::Throttled { reason, .. } = c.outcome {
                let name = reason.map_or("unknown", Reason::as_str).to_owned();
                match counts.iter_mut().find(|(n, _)| *n == name) {
                    Some((_, k)) => *k += 1,
                    None => counts.push((name, 1)),
                }
            }
        }
        counts.sort_by(|a, b| b.1.cmp(&a.1).then_with(|| a.0.cmp(&b.0)));
        counts
    }

    /// Share of the complex agent's calls that were refused.
    pub(crate) fn complex_throttled(&self) -> f64 {
        let s = self.stats(Agent::Complex);
        s.throttled as f64 / s.calls.max(1) as f64
    }

    fn runaway(&self) -> impl Iterator<Item = &CallRecord> {
        self.calls.iter().filter(|c| c.agent == Agent::Runaway)
    }

    /// The runaway's calls that were not refused (they reached the server's tools).
    pub(crate) fn runaway_admitted(&self) -> usize {
        self.runaway()
            .filter(|c| !matches!(c.outcome, Outcome::Throttled { .. }))
            .count()
    }

    /// How many calls the runaway had made when it was first refused (that one included).
    pub(crate) fn runaway_calls_to_first_throttle(&self) -> Option<usize> {
        self.runaway()
            .position(|c| matches!(c.outcome, Outcome::Throttled { .. }))
            .map(|i| i + 1)
    }

    /// From the runaway's start to its first refusal.
    pub(crate) fn time_to_first_throttle(&self) -> Option<Duration> {
        self.runaway()
            .find(|c| matches!(c.outcome, Outcome::Throttled { .. }))
            .map(|c| c.at - self.settings.runaway_start)
    }

    /// The runaway's calls sent after the first that went wrong for it (a failure, a timeout,
    /// or a slow answer over [`app::SLOW_QUERY`]) and before its first refusal. `Some(0)`
    /// when it was refused before anything went wrong; `None` when it was never refused.
    pub(crate) fn calls_after_trouble_until_throttle(&self) -> Option<usize> {
        let calls: Vec<&CallRecord> = self.runaway().collect();
        let throttle = calls
            .iter()
            .position(|c| matches!(c.outcome, Outcome::Throttled { .. }))?;
        let trouble = calls.iter().position(|c| {
            matches!(c.outcome, Outcome::Error | Outcome::Timeout) || c.latency > app::SLOW_QUERY
        });
        Some(match trouble {
            Some(t) if t < throttle => throttle - t,
            _ => 0,
        })
    }
}

/// A small deterministic generator (SplitMix64): the run needs reproducible choices, not
/// cryptographic ones.
#[derive(Debug, Clone)]
pub(crate) struct Rng(u64);

impl Rng {
    /// A generator for `seed` and `stream` (each agent draws from its own stream).
    pub(crate) fn new(seed: u64, stream: u64) -> Self {
        Rng(seed ^ stream.wrapping_mul(0x9E37_79B9_7F4A_7C15))
    }

    /// The next number.
    pub(crate) fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// A duration uniformly in `[lo, hi)`.
    pub(crate) fn between(&mut self, lo: Duration, hi: Duration) -> Duration {
        let span = (hi - lo).as_micros() as u64;
        lo + Duration::from_micros(self.next_u64() % span.max(1))
    }
}

type Client = RunningService<RoleClient, ClientConfig>;

/// Connects an rmcp client for `tenant` to `router`, returning it and the session id the
/// server gave it.
async fn connect(router: &axum::Router, tenant: &str) -> (Client, Option<SessionId>) {
    let mut config = StreamableHttpClientTransportConfig::with_uri("http://localhost/mcp");
    config.custom_headers.insert(
        http::HeaderName::from_static(TENANT_HEADER),
        http::HeaderValue::from_str(tenant).expect("tenant names are ASCII"),
    );
    let http = InProcess::new(router.clone());
    let transport = StreamableHttpClientTransport::with_client(http.clone(), config);
    let client = ClientConfig::default()
        .serve(transport)
        .await
        .expect("the MCP handshake succeeds");
    (client, http.session().map(SessionId::new))
}

fn tool(name: &str, arguments: Value) -> CallToolRequestParams {
    let Value::Object(map) = arguments else {
        unreachable!("arguments are objects")
    };
    CallToolRequestParams::new(name.to_owned()).with_arguments(map)
}

fn outcome(
    result: Result<Result<CallToolResult, ServiceError>, tokio::time::error::Elapsed>,
) -> Outcome {
    match result {
        Err(_) => Outcome::Timeout,
        Ok(Ok(r)) if r.is_error == Some(true) => Outcome::Error,
        Ok(Ok(_)) => Outcome::Ok,
        Ok(Err(ServiceError::McpError(e))) if e.code.0 == -32029 => {
            let data = e.data.unwrap_or_default();
            let reason = data["reason"].as_str();
            Outcome::Throttled {
                retry_after: Duration::from_millis(data["retry_after_ms"].as_u64().unwrap_or(1000)),
                reason: Reason::ALL.into_iter().find(|r| Some(r.as_str()) == reason),
            }
        }
        Ok(Err(_)) => Outcome::Error,
    }
}

/// One call: sends it, waits at most `timeout`, records it.
async fn call(
    client: &Client,
    agent: Agent,
    start: Instant,
    log: &Mutex<Vec<CallRecord>>,
    params: CallToolRequestParams,
    timeout: Duration,
) -> Outcome {
    let at = Instant::now();
    let result = tokio::time::timeout(timeout, client.call_tool(params)).await;
    let outcome = outcome(result);
    log.lock().unwrap().push(CallRecord {
        agent,
        at: at - start,
        latency: at.elapsed(),
        outcome,
    });
    outcome
}

/// How long every agent waits for an answer before it gives up.
const TIMEOUT: Duration = Duration::from_secs(1);

/// A steady agent: the same report every second or so.
async fn steady(
    client: Client,
    id: usize,
    s: Settings,
    start: Instant,
    log: Arc<Mutex<Vec<CallRecord>>>,
) {
    let mut rng = Rng::new(s.seed, 100 + id as u64);
    let end = start + s.duration;
    tokio::time::sleep(rng.between(Duration::ZERO, Duration::from_secs(1))).await;
    while Instant::now() < end {
        let params = tool(
            "sql_scan",
            json!({"table": "orders", "filter": format!("region = {id} and status = 'open'")}),
        );
        let o = call(&client, Agent::Steady, start, &log, params, TIMEOUT).await;
        let pause = rng.between(Duration::from_millis(900), Duration::from_millis(1100));
        tokio::time::sleep(match o {
            Outcome::Throttled { retry_after, .. } => retry_after.max(pause),
            _ => pause,
        })
        .await;
    }
    client.cancel().await.ok();
}

/// The complex agent's worker: five tools round-robin, varied but known arguments.
async fn complex(
    client: Arc<Client>,
    worker: u64,
    s: Settings,
    start: Instant,
    log: Arc<Mutex<Vec<CallRecord>>>,
) {
    let mut rng = Rng::new(s.seed, 200 + worker);
    let end = start + s.duration;
    let mut n: u64 = worker;
    while Instant::now() < end {
        let topic = rng.next_u64() % 12;
        let params = match n % 5 {
            0 => tool(
                "cache_get",
                json!({"key": format!("user:{}", rng.next_u64() % 50)}),
            ),
            1 => tool(
                "vector_search",
                json!({"query": format!("design notes topic {topic}"), "top_k": 5}),
            ),
            2 => tool(
                "sql_scan",
                json!({"table": "reports", "filter": format!("quarter = {}", topic % 4)}),
            ),
            3 => tool(
                "read_doc",
                json!({"id": format!("doc-{}", rng.next_u64() % 40)}),
            ),
            _ => serde_json::from_value(json!({
                "name": "create_order",
                "arguments": {"item": format!("part-{topic}"), "quantity": 1},
                "_meta": {"idempotency_key": format!("w{worker}-{n}")},
            }))
            .expect("valid tools/call params"),
        };
        n += 2;
        let o = call(&client, Agent::Complex, start, &log, params, TIMEOUT).await;
        let pause = rng.between(Duration::from_millis(150), Duration::from_millis(350));
        tokio::time::sleep(match o {
            Outcome::Throttled { retry_after, .. } => retry_after.max(pause),
            _ => pause,
        })
        .await;
    }
}

/// Parallel searches the runaway keeps open at first; it adds one every
/// [`RUNAWAY_RAMP_EVERY`] up to [`RUNAWAY_MAX_WORKERS`].
const RUNAWAY_WORKERS: u64 = 2;
const RUNAWAY_MAX_WORKERS: u64 = 10;
const RUNAWAY_RAMP_EVERY: Duration = Duration::from_secs(10);

/// One of the runaway's parallel searches: a new query every time; an error or a timeout is
/// retried at once with yet another query; a refusal is retried after its `retry_after_ms`.
async fn runaway_worker(
    client: Arc<Client>,
    worker: u64,
    s: Settings,
    start: Instant,
    log: Arc<Mutex<Vec<CallRecord>>>,
) {
    const WORDS: [&str; 16] = [
        "latency", "context", "pool", "tenant", "storm", "retry", "budget", "agent", "queue",
        "entropy", "cache", "index", "shard", "replica", "vacuum", "planner",
    ];
    let mut rng = Rng::new(s.seed, 300 + worker);
    let end = start + s.duration;
    while Instant::now() < end {
        let words: Vec<&str> = (0..3)
            .map(|_| WORDS[(rng.next_u64() % WORDS.len() as u64) as usize])
            .collect();
        let query = format!(
            "body ilike '%{}%' /* {} */",
            words.join(" "),
            rng.next_u64() % 100_000
        );
        let params = tool("sql_scan", json!({"table": "documents", "filter": query}));
        match call(&client, Agent::Runaway, start, &log, params, TIMEOUT).await {
            Outcome::Ok => {
                tokio::time::sleep(
                    rng.between(Duration::from_millis(200), Duration::from_millis(600)),
                )
                .await
            }
            Outcome::Error | Outcome::Timeout => {} // "not enough context yet": again, now
            Outcome::Throttled { retry_after, .. } => tokio::time::sleep(retry_after).await,
        }
    }
}

async fn runaway(client: Client, s: Settings, start: Instant, log: Arc<Mutex<Vec<CallRecord>>>) {
    let client = Arc::new(client);
    let end = start + s.duration;
    let mut workers = Vec::new();
    let mut next = 0;
    while Instant::now() < end && next < RUNAWAY_MAX_WORKERS {
        let n = if next == 0 { RUNAWAY_WORKERS } else { 1 };
        for _ in 0..n {
            workers.push(tokio::spawn(runaway_worker(
                client.clone(),
                next,
                s,
                start,
                log.clone(),
            )));
            next += 1;
        }
        tokio::time::sleep(RUNAWAY_RAMP_EVERY).await;
    }
    for w in workers {
        w.await.expect("runaway worker");
    }
}

/// Runs the scenario once under `policy`. Call it on a runtime with a paused clock for a
/// deterministic, fast run (it works on a real clock too, in real time).
pub(crate) async fn run(policy: Policy, settings: Settings) -> Report {
    let backend = Backend::with_cache(Duration::from_millis(50), Duration::from_millis(600));
    let control = Control::new(policy.config()).expect("valid config");
    let _tasks = control.spawn();
    let router = control.wrap(app::mcp_router(backend.clone()));
    let log = Arc::new(Mutex::new(Vec::new()));
    let start = Instant::now();

    let mut agents = Vec::new();
    for id in 0..settings.steady_agents {
        let (client, _) = connect(&router, &format!("steady-{id}")).await;
        agents.push(tokio::spawn(steady(
            client,
            id,
            settings,
            start,
            log.clone(),
        )));
    }
    let complex_client = Arc::new(connect(&router, "complex").await.0);
    for worker in 0..2 {
        agents.push(tokio::spawn(complex(
            complex_client.clone(),
            worker,
            settings,
            start,
            log.clone(),
        )));
    }
    let runaway_session: Arc<Mutex<Option<SessionId>>> = Arc::default();
    {
        let (router, log, session) = (router.clone(), log.clone(), runaway_session.clone());
        agents.push(tokio::spawn(async move {
            tokio::time::sleep_until(start + settings.runaway_start).await;
            let (client, id) = connect(&router, "runaway").await;
            *session.lock().unwrap() = id;
            runaway(client, settings, start, log).await;
        }));
    }

    // The sampler: budget, the runaway's score, the pool's worst wait.
    let mut samples = Vec::new();
    let mut seen_scans = 0;
    let mut tick = tokio::time::interval_at(start + SAMPLE_EVERY, SAMPLE_EVERY);
    while Instant::now() < start + settings.duration {
        tick.tick().await;
        let scans = backend.scan_log();
        let pool_wait = scans[seen_scans.min(scans.len())..]
            .iter()
            .map(|s| s.pool_wait)
            .max()
            .unwrap_or_default();
        seen_scans = scans.len();
        let runaway_score = runaway_session
            .lock()
            .unwrap()
            .as_ref()
            .and_then(|id| control.sessions().summary(id))
            .map_or(0.0, |s| s.score);
        samples.push(Sample {
            at: start.elapsed(),
            budget: control.budget().current(),
            runaway_score,
            pool_wait,
        });
    }
    for a in agents {
        a.await.expect("agent task");
    }
    let calls = log.lock().unwrap().clone();
    Report {
        policy,
        calls,
        scans: backend.scan_log(),
        samples,
        settings,
    }
}
