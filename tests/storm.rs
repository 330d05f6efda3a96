//! The storm demo's scenarios (examples/storm) as regression tests: the same agents, seed and
//! policies, on tokio's paused clock, and every goal of each scenario asserted for stormgate
//! (the goals are `scenario::goals`, shared with the demo). A change that weakens protection
//! fails here. One test per scenario, so they run in parallel.

#[path = "../examples/mcp_server/app.rs"]
mod app;
#[path = "../examples/storm/inprocess.rs"]
mod inprocess;
#[path = "../examples/storm/peers.rs"]
#[allow(dead_code)] // the tests run no peer
mod peers;
#[path = "../examples/storm/scenario.rs"]
mod scenario;

use std::time::Duration;

use scenario::{Policy, Report, Scenario, Settings};

/// Asserts every goal of `adaptive`'s scenario for stormgate, against `off`, the storm score
/// included: where the runaway waits its refusals' hints (storm, slow-drift, one-tenant) its
/// retries of timeouts and errors still come at once, more than its callers' waits explain.
fn assert_goals(adaptive: &Report, off: &Report) {
    let missed: Vec<String> = scenario::goals(adaptive, off)
        .into_iter()
        .filter(scenario::Goal::missed)
        .map(|g| format!("{}: {}", g.name, g.detail))
        .collect();
    assert!(
        missed.is_empty(),
        "stormgate missed goals of the {} scenario:\n  {}",
        adaptive.settings.scenario.name(),
        missed.join("\n  ")
    );
}

/// Runs `settings` without protection and with stormgate, asserts every goal of the scenario
/// for stormgate, and returns both runs.
async fn stormgate_meets_every_goal(settings: Settings) -> (Report, Report) {
    let off = scenario::run(Policy::Off, settings).await;
    let adaptive = scenario::run(Policy::Stormgate, settings).await;
    assert_goals(&adaptive, &off);
    (off, adaptive)
}

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn storm_stormgate_tames_it_and_beats_a_fixed_limit() {
    let settings = Settings::new(Scenario::Storm);
    let off = scenario::run(Policy::Off, settings).await;
    assert!(
        off.slow_queries() > 100,
        "the scenario must be a storm without protection: {} slow queries",
        off.slow_queries()
    );
    let adaptive = scenario::run(Policy::Stormgate, settings).await;
    assert_goals(&adaptive, &off);

    // A fixed per-session limit misses at least one goal at either setting: loose enough to
    // spare the complex agent, it lets the storm through; tight enough to stop the runaway,
    // it throttles the complex agent.
    for rate in [8, 2] {
        let fixed = scenario::run(Policy::Fixed(rate), settings).await;
        let missed = scenario::goals(&fixed, &off)
            .iter()
            .filter(|g| g.missed())
            .count();
        assert!(missed > 0, "a fixed {rate}/s limit met every goal");
    }
}

/// Also the goal that is easiest to miss here (a runaway cut 7 s after the steady p99 doubled
/// misses it): the drifting runaway is refused before the steady agents' p99 doubles. Its
/// scans slow down with everyone's, but it holds the backend longest and pays for it.
#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn slow_drift_stormgate_cuts_the_runaway_before_the_steady_p99_doubles() {
    let (off, adaptive) = stormgate_meets_every_goal(Settings::new(Scenario::SlowDrift)).await;
    assert!(
        off.steady_p99_doubled_at().is_some(),
        "without protection the drift must double the steady agents' p99"
    );
    assert_eq!(
        adaptive.runaway_cut_first(),
        Some(true),
        "steady p99 doubled at {:?}, runaway first refused at {:?}",
        adaptive.steady_p99_doubled_at(),
        adaptive.runaway_first_refused_at()
    );
}

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn one_tenant_stormgate_tells_its_sessions_apart() {
    stormgate_meets_every_goal(Settings::new(Scenario::OneTenant)).await;
}

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn clumsy_stormgate_refuses_nobody_else() {
    stormgate_meets_every_goal(Settings::new(Scenario::Clumsy)).await;
}

/// The novel agent is spared (judged against the steady agents' warm 50 ms, about 63% of its
/// calls would be refused): its cold 600 ms scans are judged against its own healthy latency,
/// and at one at a time they cost less than its budget.
#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn novel_stormgate_spares_novel_work_and_keeps_the_budget() {
    let (_, adaptive) = stormgate_meets_every_goal(Settings::new(Scenario::Novel)).await;
    assert_eq!(adaptive.budget_min(), adaptive.stable_budget());
}

/// The swarm: the runaway over 8 sessions of the steady agents' tenant, retrying its refusals
/// at once. Without reading how a client treats its refusals, the guard would refuse the
/// steady agents 349 times and the complex agent on 12.49% of its calls.
#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn swarm_stormgate_refuses_the_swarm_and_nobody_else() {
    let (_, adaptive) = stormgate_meets_every_goal(Settings::new(Scenario::Swarm)).await;
    assert_eq!(adaptive.stats(scenario::Agent::Steady).throttled, 0);
    assert_eq!(adaptive.budget_min(), adaptive.stable_budget());
}

/// The stateless agents: MCP 2026-07-28, no session ids, a bearer token each, one tenant.
#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn stateless_stormgate_tells_agents_apart_by_their_tokens() {
    stormgate_meets_every_goal(Settings::new(Scenario::Stateless)).await;
}

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn the_scenario_is_deterministic() {
    let settings = Settings {
        duration: Duration::from_secs(60),
        ..Settings::new(Scenario::Storm)
    };
    let a = scenario::run(Policy::Stormgate, settings).await;
    let b = scenario::run(Policy::Stormgate, settings).await;
    let key = |r: &Report| {
        r.calls
            .iter()
            .map(|c| format!("{:?}{:?}{:?}{:?}", c.agent, c.at, c.latency, c.outcome))
            .collect::<Vec<_>>()
    };
    assert_eq!(key(&a), key(&b));
}
