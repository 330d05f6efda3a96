//! The storm demo's scenario (examples/storm) as a regression test: the same agents, seed and
//! policies, on tokio's paused clock, and the goals of the storm demo asserted. A change that
//! weakens protection fails here.

#[path = "../examples/mcp_server/app.rs"]
mod app;
#[path = "../examples/storm/inprocess.rs"]
mod inprocess;
#[path = "../examples/storm/scenario.rs"]
mod scenario;

use scenario::{Agent, Policy, Report, Settings};

/// The four goals, each as (met, what was measured).
fn goals(r: &Report, off: &Report) -> [(bool, String); 4] {
    let slow = r.slow_queries();
    let cut = 1.0 - slow as f64 / off.slow_queries().max(1) as f64;
    let after = r.calls_after_trouble_until_throttle();
    let complex = r.complex_throttled();
    let steady = r.stats(Agent::Steady).throttled;
    [
        (
            cut >= 0.8,
            format!(
                "{slow} slow queries vs {} off ({:.0}% fewer)",
                off.slow_queries(),
                cut * 100.0
            ),
        ),
        (
            after.is_some_and(|n| n <= 15),
            format!("runaway refused {after:?} calls after trouble began"),
        ),
        (
            complex <= 0.01,
            format!(
                "complex agent throttled on {:.2}% of calls",
                complex * 100.0
            ),
        ),
        (steady == 0, format!("steady agents refused {steady} times")),
    ]
}

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn stormgate_tames_the_storm_and_beats_a_fixed_limit() {
    let settings = Settings::default();
    let off = scenario::run(Policy::Off, settings).await;
    assert!(
        off.slow_queries() > 100,
        "the scenario must be a storm without protection: {} slow queries",
        off.slow_queries()
    );

    let adaptive = scenario::run(Policy::Stormgate, settings).await;
    for (met, what) in goals(&adaptive, &off) {
        assert!(met, "stormgate missed a goal: {what}");
    }

    // A fixed per-session limit misses at least one goal at either setting: loose enough to
    // spare the complex agent, it lets the storm through; tight enough to stop the runaway,
    // it throttles the complex agent.
    for rate in [8, 2] {
        let fixed = scenario::run(Policy::Fixed(rate), settings).await;
        let missed: Vec<String> = goals(&fixed, &off)
            .into_iter()
            .filter(|(met, _)| !met)
            .map(|(_, what)| what)
            .collect();
        assert!(!missed.is_empty(), "a fixed {rate}/s limit met every goal");
    }
}

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn the_scenario_is_deterministic() {
    let settings = Settings {
        duration: std::time::Duration::from_secs(60),
        ..Settings::default()
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
