//! The storm demo's scenarios (the storm and six more): steady agents, a complex but healthy
//! agent, a runaway, a clumsy client or a novel worker share the example server's database
//! pool, under one protection policy.
//!
//! Every agent is rmcp's own client speaking streamable HTTP to the example server's real
//! rmcp service through the whole axum stack ([`crate::inprocess`]); the scenario runs on
//! tokio's clock, so under `start_paused` a run of minutes takes seconds and a seed gives the
//! same numbers every time. Shared by `examples/storm` (the demo) and `tests/storm.rs` (the
//! goals as assertions): the goals are computed here, by [`goals`].

#![allow(dead_code)] // the test reads fewer fields than the demo prints

use std::sync::{Arc, Mutex};
use std::time::Duration;

use rmcp::model::{CallToolRequestParams, ClientConfig, ProtocolVersion};
use rmcp::service::{
    ClientLifecycleMode, ClientServiceExt, RoleClient, RunningService, ServiceError,
};
use rmcp::transport::StreamableHttpClientTransport;
use rmcp::transport::streamable_http_client::StreamableHttpClientTransportConfig;
use rmcp::{ServiceExt, model::CallToolResult};
use serde_json::{Value, json};
use stormgate::control::{Config, Control};
use stormgate::{Reason, SessionId};
use tokio::time::Instant;
use tower_resilience::adaptive::{Aimd, Vegas};

use crate::app::{self, Backend};
use crate::inprocess::InProcess;
use crate::peers;

/// The stormgate configuration of the demo's adaptive policy, the same in every scenario.
pub(crate) const STORMGATE_TOML: &str = include_str!("stormgate.toml");

/// Tenant header every agent's client sends.
const TENANT_HEADER: &str = "x-tenant";

/// What the agents do and against which backend.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Scenario {
    /// The storm: steady agents, the complex agent, and from 30 s a runaway that ramps fast (2
    /// searches at once, one more every 10 s up to 10), every query new and cold (600 ms,
    /// against 50 ms for a query seen before).
    Storm,
    /// A diverse runaway that ramps slowly (1 search, one more every 20 s up to 12) against a
    /// load-sensitive database without a cache: every scan slows down with the recent load,
    /// so its own load degrades the pool gradually, with no errors at first.
    SlowDrift,
    /// [`Scenario::Storm`] with every agent sending the same tenant: one customer, many
    /// sessions.
    OneTenant,
    /// No runaway: beside the steady and complex agents, a clumsy session calling a tool that
    /// does not exist and real tools with bad arguments, a few times a second.
    Clumsy,
    /// No runaway: beside the steady agents, one agent doing legitimately novel expensive
    /// work: a new (cold) query every call, one at a time, a pause of 1-2 s between calls.
    Novel,
    /// The storm's runaway spread over 8 sessions, as an orchestrator's sub-agents are, every
    /// agent of one tenant, and each search retrying its refusals at once (every 20 ms),
    /// ignoring `retry_after_ms`, as a runaway retrying at once does.
    Swarm,
    /// The storm's agents speaking MCP 2026-07-28 (no `Mcp-Session-Id` exists), each with
    /// its own bearer token, every agent of one tenant; the runaway retries its refusals at
    /// once (every 20 ms), ignoring `retry_after_ms`, as a runaway retrying at once does.
    Stateless,
}

impl Scenario {
    /// Every scenario, in the order the demo runs them.
    pub(crate) const ALL: [Scenario; 7] = [
        Scenario::Storm,
        Scenario::SlowDrift,
        Scenario::OneTenant,
        Scenario::Clumsy,
        Scenario::Novel,
        Scenario::Swarm,
        Scenario::Stateless,
    ];

    /// Its name (`--scenario NAME`).
    pub(crate) fn name(self) -> &'static str {
        match self {
            Scenario::Storm => "storm",
            Scenario::SlowDrift => "slow-drift",
            Scenario::OneTenant => "one-tenant",
            Scenario::Clumsy => "clumsy",
            Scenario::Novel => "novel",
            Scenario::Swarm => "swarm",
            Scenario::Stateless => "stateless",
        }
    }

    /// One line on what happens in it.
    pub(crate) fn description(self) -> &'static str {
        match self {
            Scenario::Storm => {
                "4 steady agents, the complex agent, and from 30 s a runaway: new cold query every call, errors retried at once, 2 searches at once +1 every 10 s up to 10"
            }
            Scenario::SlowDrift => {
                "the same agents on a load-sensitive database (no cache; a scan holds its connection 50 ms x (1 + 2 x scans started in the last 5 s / 20)); from 30 s a runaway with new queries, errors retried at once, ramping slowly: 1 search +1 every 20 s up to 12"
            }
            Scenario::OneTenant => {
                "the storm, every agent sending the same tenant (one customer, many sessions)"
            }
            Scenario::Clumsy => {
                "no runaway: 4 steady agents, the complex agent, and a clumsy session calling an unknown tool and real tools with bad arguments about 3 times a second"
            }
            Scenario::Novel => {
                "no runaway: 4 steady agents and one agent doing novel expensive work: a new cold scan (600 ms) every call, one at a time, 1-2 s between calls"
            }
            Scenario::Swarm => {
                "the storm's runaway spread over 8 sessions (an orchestrator's sub-agents), every agent of one tenant, each search retrying its refusals at once (every 20 ms), ignoring retry_after_ms"
            }
            Scenario::Stateless => {
                "the storm's agents on MCP 2026-07-28 (no session ids), each with its own bearer token, every agent of one tenant; the runaway retries its refusals at once (every 20 ms), ignoring retry_after_ms"
            }
        }
    }

    /// The scenario called `name`.
    pub(crate) fn from_name(name: &str) -> Option<Scenario> {
        Scenario::ALL.into_iter().find(|s| s.name() == name)
    }

    /// How the runaway ramps up, if there is one.
    pub(crate) fn runaway(self) -> Option<Ramp> {
        match self {
            Scenario::Storm | Scenario::OneTenant | Scenario::Swarm | Scenario::Stateless => {
                Some(Ramp {
                    first: 2,
                    max: 10,
                    every: Duration::from_secs(10),
                })
            }
            Scenario::SlowDrift => Some(Ramp {
                first: 1,
                max: 12,
                every: Duration::from_secs(20),
            }),
            Scenario::Clumsy | Scenario::Novel => None,
        }
    }

    /// The sessions the runaway's searches are spread over.
    fn runaway_sessions(self) -> usize {
        if self == Scenario::Swarm { 8 } else { 1 }
    }

    /// Whether the runaway retries its refusals at once instead of after `retry_after_ms`.
    pub(crate) fn ignores_hints(self) -> bool {
        matches!(self, Scenario::Swarm | Scenario::Stateless)
    }

    /// Whether the agents speak MCP 2026-07-28, with no session, each presenting its own
    /// bearer token.
    fn stateless(self) -> bool {
        self == Scenario::Stateless
    }

    /// Whether the complex agent takes part.
    pub(crate) fn has_complex(self) -> bool {
        self != Scenario::Novel
    }

    /// Whether the clumsy session takes part.
    pub(crate) fn has_clumsy(self) -> bool {
        self == Scenario::Clumsy
    }

    /// Whether the novel agent takes part.
    pub(crate) fn has_novel(self) -> bool {
        self == Scenario::Novel
    }

    /// The tenant `agent`'s client sends.
    fn tenant(self, agent: &str) -> String {
        match self {
            Scenario::OneTenant | Scenario::Swarm | Scenario::Stateless => "acme".into(),
            _ => agent.into(),
        }
    }

    /// The database the agents share.
    fn backend(self) -> Arc<Backend> {
        match self {
            Scenario::SlowDrift => Backend::load_sensitive(DRIFT_BASE, DRIFT_LOAD),
            _ => Backend::with_cache(WARM, COLD),
        }
    }

    /// The default length of a run.
    fn duration(self) -> Duration {
        match self {
            Scenario::Storm | Scenario::OneTenant | Scenario::Swarm | Scenario::Stateless => {
                Duration::from_secs(180)
            }
            Scenario::SlowDrift => Duration::from_secs(270),
            Scenario::Clumsy | Scenario::Novel => Duration::from_secs(120),
        }
    }
}

/// A scan of a query seen before (the cache backend).
const WARM: Duration = Duration::from_millis(50);
/// A scan of a new query (the cache backend).
const COLD: Duration = Duration::from_millis(600);
/// A scan on the load-sensitive backend with no load.
const DRIFT_BASE: Duration = Duration::from_millis(50);
/// The load-sensitive backend: a scan holds its connection for
/// `50 ms x (1 + 2 x scans started in the last 5 s / 20)`. The steady and complex agents
/// alone start about 27 scans per 5 s (a hold of about 185 ms); the runaway's searches add
/// about 10 each at first, fewer as they slow down. Without protection the steady agents'
/// p99 doubles about a minute after the runaway starts, passes 900 ms at about 190 s, and
/// the pool melts down (timeouts, retries at once, failed scans) from about 225 s, with 11
/// searches.
const DRIFT_LOAD: app::Load = app::Load {
    k: 2.0,
    capacity: 20.0,
};

/// How the runaway grows: `first` parallel searches at its start, one more every `every`,
/// up to `max`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Ramp {
    /// Searches at the start.
    pub(crate) first: u64,
    /// Searches at most.
    pub(crate) max: u64,
    /// One more search this often.
    pub(crate) every: Duration,
}

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
    /// The `governor` crate's keyed limiter, this many calls per second per MCP session,
    /// bursts of twice that ([`peers::governor_router`]).
    Governor(u32),
    /// tower-resilience's AIMD adaptive concurrency limit ([`aimd`]).
    Aimd,
    /// tower-resilience's Vegas adaptive concurrency limit ([`vegas`]).
    Vegas,
}

/// The AIMD peer: tower-resilience's documented defaults (initial limit 10, max 100, +1 per
/// fast success, x0.5 per failure or slow success) but for the minimum, 4 (the pool's
/// connections), and the latency threshold, 700 ms (above a healthy cold scan's 600 ms,
/// below the agents' 1 s timeout; the default 100 ms would call every cold scan
/// congestion).
pub(crate) fn aimd() -> Aimd {
    Aimd::builder()
        .initial_limit(10)
        .min_limit(app::POOL_SIZE)
        .max_limit(100)
        .increase_by(1)
        .decrease_factor(0.5)
        .latency_threshold(Duration::from_millis(700))
        .build()
        .expect("a valid AIMD configuration")
}

/// The Vegas peer: tower-resilience's documented defaults (initial limit 10, max 100,
/// alpha 3, beta 6) but for the minimum, 4 (the pool's connections).
pub(crate) fn vegas() -> Vegas {
    Vegas::builder()
        .initial_limit(10)
        .min_limit(app::POOL_SIZE)
        .max_limit(100)
        .alpha(3)
        .beta(6)
        .build()
        .expect("a valid Vegas configuration")
}

impl Policy {
    /// The policies, in the order the demo runs them: a fixed limit set where it spares the
    /// complex agent (8/s, above its peak), and one set where it stops the runaway (2/s);
    /// stormgate; then the peers, governor at the same two rates.
    pub(crate) const ALL: [Policy; 8] = [
        Policy::Off,
        Policy::Fixed(8),
        Policy::Fixed(2),
        Policy::Stormgate,
        Policy::Governor(8),
        Policy::Governor(2),
        Policy::Aimd,
        Policy::Vegas,
    ];

    /// Its name in the table.
    pub(crate) fn name(self) -> String {
        match self {
            Policy::Off => "off".into(),
            Policy::Fixed(rate) => format!("fixed {rate}/s per session"),
            Policy::Stormgate => "stormgate adaptive".into(),
            Policy::Governor(rate) => format!("governor {rate}/s per session"),
            Policy::Aimd => "tower-resilience aimd".into(),
            Policy::Vegas => "tower-resilience vegas".into(),
        }
    }

    /// Its short name (`--policy KEY`): `off`, `fixed8`, `fixed2`, `stormgate`, `governor8`,
    /// `governor2`, `aimd`, `vegas`.
    pub(crate) fn key(self) -> String {
        match self {
            Policy::Off => "off".into(),
            Policy::Fixed(rate) => format!("fixed{rate}"),
            Policy::Stormgate => "stormgate".into(),
            Policy::Governor(rate) => format!("governor{rate}"),
            Policy::Aimd => "aimd".into(),
            Policy::Vegas => "vegas".into(),
        }
    }

    /// The policy whose [`key`](Self::key) is `key`.
    pub(crate) fn from_key(key: &str) -> Option<Policy> {
        Policy::ALL.into_iter().find(|p| p.key() == key)
    }

    /// The stack's configuration under this policy (`None` for a peer: no stormgate stack).
    pub(crate) fn config(self) -> Option<Config> {
        let text = match self {
            Policy::Off => STORMGATE_TOML.replace("mode = \"adaptive\"", "mode = \"off\""),
            Policy::Fixed(rate) => format!(
                "mode = \"fixed\"\n[identity]\ntenant_header = \"{TENANT_HEADER}\"\n\
                 [features]\nresource_limits = false\n\
                 [fixed]\nsession_rate = {rate}.0\n"
            ),
            Policy::Stormgate => STORMGATE_TOML.to_owned(),
            Policy::Governor(_) | Policy::Aimd | Policy::Vegas => return None,
        };
        Some(Config::from_toml(&text).expect("the demo's configurations are valid"))
    }

    /// `router` protected by this policy, and the stormgate control handle when the policy is
    /// a stormgate stack.
    fn protect(self, router: axum::Router) -> (axum::Router, Option<Control>) {
        match self {
            Policy::Governor(rate) => (peers::governor_router(router, rate, 2 * rate), None),
            Policy::Aimd => (
                peers::adaptive_router(router, Arc::new(peers::AdaptiveLimit::new(aimd()))),
                None,
            ),
            Policy::Vegas => (
                peers::adaptive_router(router, Arc::new(peers::AdaptiveLimit::new(vegas()))),
                None,
            ),
            _ => {
                let config = self.config().expect("a stormgate policy");
                let control = Control::new(config).expect("valid config");
                (control.wrap(router), Some(control))
            }
        }
    }
}

/// What the run does: the scenario, its length, when the runaway starts, and the seed of
/// every random choice (think times, query words).
#[derive(Debug, Clone, Copy)]
pub(crate) struct Settings {
    /// The scenario.
    pub(crate) scenario: Scenario,
    /// The seed.
    pub(crate) seed: u64,
    /// How long the whole run lasts.
    pub(crate) duration: Duration,
    /// When the runaway agent starts (the others start at once).
    pub(crate) runaway_start: Duration,
    /// Steady agents.
    pub(crate) steady_agents: usize,
}

impl Settings {
    /// The default settings of `scenario`.
    pub(crate) fn new(scenario: Scenario) -> Self {
        Settings {
            scenario,
            seed: 7,
            duration: scenario.duration(),
            runaway_start: Duration::from_secs(30),
            steady_agents: 4,
        }
    }
}

impl Default for Settings {
    fn default() -> Self {
        Settings::new(Scenario::Storm)
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
    /// Refused with `-32029 rate_limited` (429 from MCP 2026-07-28 on); the agent waits `retry_after`.
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

impl CallRecord {
    fn refused(&self) -> bool {
        matches!(self.outcome, Outcome::Throttled { .. })
    }
}

/// The kinds of agent.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Agent {
    /// One tool, similar arguments, one call a second.
    Steady,
    /// Five tools round-robin, two in flight, no errors.
    Complex,
    /// The storm's runaway: one search tool, ever-new queries, retries on every error and
    /// timeout, more parallel searches as it goes.
    Runaway,
    /// Calls a tool that does not exist and real tools with bad arguments, a few times a
    /// second.
    Clumsy,
    /// A new, expensive but healthy query every call, one at a time, with pauses.
    Novel,
}

impl Agent {
    /// Every kind.
    pub(crate) const ALL: [Agent; 5] = [
        Agent::Steady,
        Agent::Complex,
        Agent::Runaway,
        Agent::Clumsy,
        Agent::Novel,
    ];

    /// Its name in the demo's lines.
    pub(crate) fn name(self) -> &'static str {
        match self {
            Agent::Steady => "steady",
            Agent::Complex => "complex",
            Agent::Runaway => "runaway",
            Agent::Clumsy => "clumsy",
            Agent::Novel => "novel",
        }
    }
}

/// One sample of the run's state, every [`SAMPLE_EVERY`].
#[derive(Debug, Clone, Copy)]
pub(crate) struct Sample {
    /// From the start of the run.
    pub(crate) at: Duration,
    /// The global budget, cost units per second (NaN under a peer: it has none).
    pub(crate) budget: f64,
    /// The runaway's storm score (0 before it starts, and under a peer).
    pub(crate) runaway_score: f64,
    /// The runaway's session budget factor (1 before it starts, and under a peer).
    pub(crate) runaway_factor: f64,
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

/// The 99th percentile of `latencies` (sorted in place); zero when empty.
fn p99(latencies: &mut [Duration]) -> Duration {
    latencies.sort();
    if latencies.is_empty() {
        return Duration::ZERO;
    }
    let i = ((latencies.len() as f64 * 0.99).ceil() as usize).clamp(1, latencies.len());
    latencies[i - 1]
}

/// The sliding window over which the steady agents' p99 is followed in the slow drift.
pub(crate) const DRIFT_WINDOW: Duration = Duration::from_secs(10);

impl Report {
    /// Database scans that took longer than [`app::SLOW_QUERY`], pool wait included.
    pub(crate) fn slow_queries(&self) -> usize {
        self.scans
            .iter()
            .filter(|s| s.total > app::SLOW_QUERY)
            .count()
    }

    fn of(&self, agent: Agent) -> impl Iterator<Item = &CallRecord> {
        self.calls.iter().filter(move |c| c.agent == agent)
    }

    /// Figures of one agent kind.
    pub(crate) fn stats(&self, agent: Agent) -> AgentStats {
        let mut s = AgentStats::default();
        let mut latencies = Vec::new();
        for c in self.of(agent) {
            s.calls += 1;
            match c.outcome {
                Outcome::Ok => s.ok += 1,
                Outcome::Throttled { .. } => s.throttled += 1,
                Outcome::Error | Outcome::Timeout => s.failed += 1,
            }
            if !c.refused() {
                latencies.push(c.latency);
            }
        }
        s.p99 = p99(&mut latencies);
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
        for c in self.of(agent) {
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

    /// Share of `agent`'s calls that were refused.
    pub(crate) fn refused_share(&self, agent: Agent) -> f64 {
        let s = self.stats(agent);
        s.throttled as f64 / s.calls.max(1) as f64
    }

    /// Share of the complex agent's calls that were refused.
    pub(crate) fn complex_throttled(&self) -> f64 {
        self.refused_share(Agent::Complex)
    }

    /// Refusals of every agent but the clumsy session.
    pub(crate) fn others_refused(&self) -> usize {
        self.calls
            .iter()
            .filter(|c| c.agent != Agent::Clumsy && c.refused())
            .count()
    }

    /// The stable global budget of the policy's configuration, cost units per second (`None`
    /// under a peer).
    pub(crate) fn stable_budget(&self) -> Option<f64> {
        self.policy.config().map(|c| c.budget.stable_budget.get())
    }

    /// The lowest global budget sampled over the run (`None` under a peer: it has none).
    pub(crate) fn budget_min(&self) -> Option<f64> {
        self.samples
            .iter()
            .map(|s| s.budget)
            .filter(|b| !b.is_nan())
            .reduce(f64::min)
    }

    fn runaway(&self) -> impl Iterator<Item = &CallRecord> {
        self.of(Agent::Runaway)
    }

    /// The runaway's calls that were not refused (they reached the server's tools).
    pub(crate) fn runaway_admitted(&self) -> usize {
        self.runaway().filter(|c| !c.refused()).count()
    }

    /// How many calls the runaway had made when it was first refused (that one included).
    pub(crate) fn runaway_calls_to_first_throttle(&self) -> Option<usize> {
        self.runaway().position(CallRecord::refused).map(|i| i + 1)
    }

    /// From the runaway's start to its first refusal.
    pub(crate) fn time_to_first_throttle(&self) -> Option<Duration> {
        self.runaway_first_refused_at()
            .map(|at| at - self.settings.runaway_start)
    }

    /// When the runaway was first refused, from the start of the run.
    pub(crate) fn runaway_first_refused_at(&self) -> Option<Duration> {
        self.runaway().find(|c| c.refused()).map(|c| c.at)
    }

    /// The runaway's calls sent after the first that went wrong for it (a failure, a timeout,
    /// or a slow answer over [`app::SLOW_QUERY`]) and before its first refusal. `Some(0)`
    /// when it was refused before anything went wrong; `None` when it was never refused.
    pub(crate) fn calls_after_trouble_until_throttle(&self) -> Option<usize> {
        let calls: Vec<&CallRecord> = self.runaway().collect();
        let throttle = calls.iter().position(|c| c.refused())?;
        let trouble = calls.iter().position(|c| {
            matches!(c.outcome, Outcome::Error | Outcome::Timeout) || c.latency > app::SLOW_QUERY
        });
        Some(match trouble {
            Some(t) if t < throttle => throttle - t,
            _ => 0,
        })
    }

    /// The steady agents' p99 before the runaway started (their calls not refused).
    pub(crate) fn steady_p99_before_runaway(&self) -> Duration {
        let mut before: Vec<Duration> = self
            .of(Agent::Steady)
            .filter(|c| !c.refused() && c.at < self.settings.runaway_start)
            .map(|c| c.latency)
            .collect();
        p99(&mut before)
    }

    /// When the steady agents' p99, over the [`DRIFT_WINDOW`] of their calls sent before each
    /// of them, first exceeded twice [`steady_p99_before_runaway`](Self::steady_p99_before_runaway)
    /// after the runaway started (`None`: it never did). A refused call has no latency and is
    /// left out.
    pub(crate) fn steady_p99_doubled_at(&self) -> Option<Duration> {
        let limit = self.steady_p99_before_runaway() * 2;
        let steady: Vec<&CallRecord> = self.of(Agent::Steady).filter(|c| !c.refused()).collect();
        let mut from = 0;
        for (i, c) in steady.iter().enumerate() {
            while steady[from].at + DRIFT_WINDOW <= c.at {
                from += 1;
            }
            if c.at < self.settings.runaway_start {
                continue;
            }
            let mut window: Vec<Duration> = steady[from..=i].iter().map(|c| c.latency).collect();
            if p99(&mut window) > limit {
                return Some(c.at);
            }
        }
        None
    }

    /// Whether the runaway was first refused before the steady agents' p99 doubled (`Some`
    /// only where there is a runaway).
    pub(crate) fn runaway_cut_first(&self) -> Option<bool> {
        self.settings.scenario.runaway()?;
        Some(
            match (
                self.runaway_first_refused_at(),
                self.steady_p99_doubled_at(),
            ) {
                (Some(cut), Some(doubled)) => cut < doubled,
                (Some(_), None) => true,
                (None, _) => false,
            },
        )
    }
}

/// Whether a policy met a goal in a run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Verdict {
    /// Met.
    Met,
    /// Missed.
    Missed,
    /// The goal says nothing about this run (e.g. no storm without protection).
    NotApplicable,
}

/// One goal of a scenario, judged on one run.
#[derive(Debug, Clone)]
pub(crate) struct Goal {
    /// What the goal asks.
    pub(crate) name: &'static str,
    /// Met or not.
    pub(crate) verdict: Verdict,
    /// What was measured.
    pub(crate) detail: String,
}

impl Goal {
    fn new(name: &'static str, met: bool, detail: String) -> Goal {
        Goal {
            name,
            verdict: if met { Verdict::Met } else { Verdict::Missed },
            detail,
        }
    }

    /// Whether it was missed.
    pub(crate) fn missed(&self) -> bool {
        self.verdict == Verdict::Missed
    }
}

/// The storm threshold of goal 2: a session budget factor below this is the guard's storm
/// state (its score at least `ln 2 / entropy_coefficient`).
pub(crate) const STORM_FACTOR: f64 = 0.5;

/// The name of goal 2's second half.
pub(crate) const SCORE_GOAL: &str = "runaway scored past the storm threshold";

/// Slow queries without protection below this: the "fewer slow queries" goal does not apply.
pub(crate) const MEANINGFUL_SLOW: usize = 20;

/// The goals of `r`'s scenario, judged on `r` against the same scenario without protection
/// (`off`):
///
/// 1. at least 80% fewer slow backend queries than `off` (where `off` has at least
///    [`MEANINGFUL_SLOW`]);
/// 2. where there is a runaway: refused within 15 calls after its trouble started, and its
///    storm score past the storm threshold (its session budget cut below
///    [`STORM_FACTOR`]; for a peer, which has no score, missed);
/// 3. the complex and the novel agents refused on at most 1% of their calls;
/// 4. the steady agents never refused;
/// 5. clumsy only: nobody but the clumsy session refused, and the global budget never cut
///    below stable (where the policy has a global budget).
pub(crate) fn goals(r: &Report, off: &Report) -> Vec<Goal> {
    let scenario = r.settings.scenario;
    let mut goals = Vec::new();
    let (slow, off_slow) = (r.slow_queries(), off.slow_queries());
    if off_slow >= MEANINGFUL_SLOW {
        let cut = 1.0 - slow as f64 / off_slow as f64;
        goals.push(Goal::new(
            "80% fewer slow queries",
            cut >= 0.8,
            format!(
                "{slow} slow queries vs {off_slow} off ({:.0}% fewer)",
                cut * 100.0
            ),
        ));
    } else {
        goals.push(Goal {
            name: "80% fewer slow queries",
            verdict: Verdict::NotApplicable,
            detail: format!("{slow} slow queries vs {off_slow} off (no storm to cut)"),
        });
    }
    if scenario.runaway().is_some() {
        let after = r.calls_after_trouble_until_throttle();
        goals.push(Goal::new(
            "runaway refused within 15 calls of trouble",
            after.is_some_and(|n| n <= 15),
            match after {
                Some(n) => format!("runaway refused {n} calls after its trouble began"),
                None => "runaway never refused".into(),
            },
        ));
        let factor = r
            .samples
            .iter()
            .map(|s| s.runaway_factor)
            .fold(1.0, f64::min);
        let score = r
            .samples
            .iter()
            .map(|s| s.runaway_score)
            .fold(0.0, f64::max);
        goals.push(Goal::new(
            SCORE_GOAL,
            factor < STORM_FACTOR,
            format!("runaway's score up to {score:.1}, its budget factor down to {factor:.2}"),
        ));
    }
    for (agent, present, name) in [
        (
            Agent::Complex,
            scenario.has_complex(),
            "complex agent refused on at most 1%",
        ),
        (
            Agent::Novel,
            scenario.has_novel(),
            "novel agent refused on at most 1%",
        ),
    ] {
        if present {
            let share = r.refused_share(agent);
            goals.push(Goal::new(
                name,
                share <= 0.01,
                format!(
                    "{} agent refused on {:.2}% of {} calls",
                    agent.name(),
                    share * 100.0,
                    r.stats(agent).calls
                ),
            ));
        }
    }
    let steady = r.stats(Agent::Steady).throttled;
    goals.push(Goal::new(
        "steady agents never refused",
        steady == 0,
        format!("steady agents refused {steady} times"),
    ));
    if scenario.has_clumsy() {
        let others = r.others_refused();
        goals.push(Goal::new(
            "nobody but the clumsy session refused",
            others == 0,
            format!(
                "others refused {others} times (clumsy {})",
                r.stats(Agent::Clumsy).throttled
            ),
        ));
        goals.push(match r.budget_min().zip(r.stable_budget()) {
            Some((min, stable)) => Goal::new(
                "global budget stays at stable",
                min >= stable,
                format!("global budget min {min:.0} (stable {stable:.0})"),
            ),
            None => Goal {
                name: "global budget stays at stable",
                verdict: Verdict::NotApplicable,
                detail: "no global budget".into(),
            },
        });
    }
    goals
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

/// Connects the rmcp client of `agent` for `tenant` to `router`, returning it and the session
/// id the server gave it. In a stateless scenario the client speaks MCP 2026-07-28 (no
/// session) and presents a bearer token of its own, made from `agent`.
async fn connect(
    router: &axum::Router,
    scenario: Scenario,
    tenant: &str,
    agent: &str,
) -> (Client, Option<SessionId>) {
    let mut config = StreamableHttpClientTransportConfig::with_uri("http://localhost/mcp");
    config.custom_headers.insert(
        http::HeaderName::from_static(TENANT_HEADER),
        http::HeaderValue::from_str(tenant).expect("tenant names are ASCII"),
    );
    let http = InProcess::new(router.clone());
    let client = if scenario.stateless() {
        config.auth_header = Some(format!("token-of-{agent}"));
        let transport = StreamableHttpClientTransport::with_client(http.clone(), config);
        let modern = ClientLifecycleMode::Discover {
            preferred_versions: vec![ProtocolVersion::V_2026_07_28],
        };
        ClientConfig::default()
            .serve_with_lifecycle(transport, modern)
            .await
    } else {
        let transport = StreamableHttpClientTransport::with_client(http.clone(), config);
        ClientConfig::default().serve(transport).await
    }
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
        Ok(Err(ServiceError::McpError(e))) if [-32029, 429].contains(&e.code.0) => {
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

/// After a call ended with `o`, the agent pauses `pause`, or longer when it was refused and
/// told to wait.
fn pause_after(o: Outcome, pause: Duration) -> Duration {
    match o {
        Outcome::Throttled { retry_after, .. } => retry_after.max(pause),
        _ => pause,
    }
}

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
        tokio::time::sleep(pause_after(o, pause)).await;
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
        tokio::time::sleep(pause_after(o, pause)).await;
    }
}

/// One of the runaway's parallel searches: a new query every time; an error or a timeout is
/// retried at once with yet another query; a refusal is retried after its `retry_after_ms`
/// (or, in a scenario whose runaway ignores hints, 20 ms later).
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
            Outcome::Throttled { .. } if s.scenario.ignores_hints() => {
                tokio::time::sleep(Duration::from_millis(20)).await
            }
            Outcome::Throttled { retry_after, .. } => tokio::time::sleep(retry_after).await,
        }
    }
}

/// The runaway: `ramp.first` parallel searches, one more every `ramp.every` up to
/// `ramp.max`, search `i` on session `i % clients.len()`.
async fn runaway(
    clients: Vec<Client>,
    ramp: Ramp,
    s: Settings,
    start: Instant,
    log: Arc<Mutex<Vec<CallRecord>>>,
) {
    let clients: Vec<Arc<Client>> = clients.into_iter().map(Arc::new).collect();
    let end = start + s.duration;
    let mut workers = Vec::new();
    let mut next = 0;
    while Instant::now() < end && next < ramp.max {
        let n = if next == 0 { ramp.first } else { 1 };
        for _ in 0..n {
            workers.push(tokio::spawn(runaway_worker(
                clients[next as usize % clients.len()].clone(),
                next,
                s,
                start,
                log.clone(),
            )));
            next += 1;
        }
        tokio::time::sleep(ramp.every).await;
    }
    for w in workers {
        w.await.expect("runaway worker");
    }
}

/// The clumsy session: all the time, a few calls a second, a tool that does not exist or a
/// real tool with bad arguments (a missing required field, a wrong type); it shrugs off the
/// errors and goes on at the same pace.
async fn clumsy(client: Client, s: Settings, start: Instant, log: Arc<Mutex<Vec<CallRecord>>>) {
    let mut rng = Rng::new(s.seed, 400);
    let end = start + s.duration;
    let mut n: u64 = 0;
    while Instant::now() < end {
        let params = match n % 6 {
            0 => tool("sql_scna", json!({"table": "orders"})), // no such tool
            1 => tool("sql_scan", json!({"tabel": "orders", "filter": "id = 1"})), // no `table`
            2 => tool("sql_scan", json!({"table": 42})),       // `table` is a string
            3 => tool("read_doc", json!({"document": "doc-1"})), // no `id`
            4 => tool("vector_search", json!({"query": "notes", "top_k": "five"})), // not a number
            _ => tool("delete_all_orders", json!({})),         // no such tool
        };
        n += 1;
        let o = call(&client, Agent::Clumsy, start, &log, params, TIMEOUT).await;
        let pause = rng.between(Duration::from_millis(250), Duration::from_millis(450));
        tokio::time::sleep(pause_after(o, pause)).await;
    }
    client.cancel().await.ok();
}

/// The novel agent: one scan at a time of a query never seen (cold: the whole expensive
/// scan), then 1-2 s to read the answer. Healthy: it never retries at once.
async fn novel(client: Client, s: Settings, start: Instant, log: Arc<Mutex<Vec<CallRecord>>>) {
    let mut rng = Rng::new(s.seed, 500);
    let end = start + s.duration;
    tokio::time::sleep(rng.between(Duration::ZERO, Duration::from_secs(1))).await;
    let mut n: u64 = 0;
    while Instant::now() < end {
        let params = tool(
            "sql_scan",
            json!({
                "table": "events",
                "filter": format!("cohort = {n} and signal > {}", rng.next_u64() % 1000),
            }),
        );
        n += 1;
        let o = call(&client, Agent::Novel, start, &log, params, TIMEOUT).await;
        let pause = rng.between(Duration::from_millis(1000), Duration::from_millis(2000));
        tokio::time::sleep(pause_after(o, pause)).await;
    }
    client.cancel().await.ok();
}

/// Runs the scenario of `settings` once under `policy`. Call it on a runtime with a paused
/// clock for a deterministic, fast run (it works on a real clock too, in real time).
pub(crate) async fn run(policy: Policy, settings: Settings) -> Report {
    let scenario = settings.scenario;
    let backend = scenario.backend();
    let (router, control) = policy.protect(app::mcp_router(backend.clone()));
    let _tasks = control.as_ref().map(Control::spawn);
    let log = Arc::new(Mutex::new(Vec::new()));
    let start = Instant::now();

    let mut agents = Vec::new();
    for id in 0..settings.steady_agents {
        let agent = format!("steady-{id}");
        let (client, _) = connect(&router, scenario, &scenario.tenant(&agent), &agent).await;
        agents.push(tokio::spawn(steady(
            client,
            id,
            settings,
            start,
            log.clone(),
        )));
    }
    if scenario.has_complex() {
        let tenant = scenario.tenant("complex");
        let complex_client = Arc::new(connect(&router, scenario, &tenant, "complex").await.0);
        for worker in 0..2 {
            agents.push(tokio::spawn(complex(
                complex_client.clone(),
                worker,
                settings,
                start,
                log.clone(),
            )));
        }
    }
    if scenario.has_clumsy() {
        let (client, _) = connect(&router, scenario, &scenario.tenant("clumsy"), "clumsy").await;
        agents.push(tokio::spawn(clumsy(client, settings, start, log.clone())));
    }
    if scenario.has_novel() {
        let (client, _) = connect(&router, scenario, &scenario.tenant("novel"), "novel").await;
        agents.push(tokio::spawn(novel(client, settings, start, log.clone())));
    }
    let runaway_session: Arc<Mutex<Option<SessionId>>> = Arc::default();
    if let Some(ramp) = scenario.runaway() {
        let (router, log, session) = (router.clone(), log.clone(), runaway_session.clone());
        let tenant = scenario.tenant("runaway");
        agents.push(tokio::spawn(async move {
            tokio::time::sleep_until(start + settings.runaway_start).await;
            let mut clients = Vec::new();
            for i in 0..scenario.runaway_sessions() {
                let (client, id) =
                    connect(&router, scenario, &tenant, &format!("runaway-{i}")).await;
                if i == 0 {
                    // The score sampled is its first session's.
                    *session.lock().unwrap() = id;
                }
                clients.push(client);
            }
            runaway(clients, ramp, settings, start, log).await;
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
        // Without sessions the runaway's identity is a keyed hash of its token the demo cannot
        // make: it is the top session by score (the others score 0).
        let runaway = control.as_ref().and_then(|control| {
            if scenario.stateless() {
                control.sessions().top().into_iter().next()
            } else {
                let id = runaway_session.lock().unwrap().clone()?;
                control.sessions().summary(&id)
            }
        });
        samples.push(Sample {
            at: start.elapsed(),
            budget: control.as_ref().map_or(f64::NAN, |c| c.budget().current()),
            runaway_score: runaway.as_ref().map_or(0.0, |s| s.score),
            runaway_factor: runaway.as_ref().map_or(1.0, |s| s.factor),
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
