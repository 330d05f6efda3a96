//! The library logs what an operator needs through `tracing`: sessions entering and leaving
//! the storm state (as a hash, never the client's id), and the global budget's cuts and
//! recoveries, a few lines per episode however long it lasts.

mod common;

use std::time::Duration;

use common::Logs;
use serde_json::json;
use stormgate::admit::Admission;
use stormgate::budget::{Budget, BudgetConfig};
use stormgate::entropy::{SessionConfig, SessionGuard};
use stormgate::outcome::{Observation, Observer, Outcome};
use stormgate::{Call, SessionId};

fn observe(o: &dyn Observer, call: &Call, outcome: Outcome, ms: u64) {
    o.observe(&Observation {
        call,
        outcome,
        service_time: Duration::from_millis(ms),
        response_bytes: 10,
        queue_wait: Duration::ZERO,
        at: tokio::time::Instant::now(),
    });
}

#[tokio::test(start_paused = true, flavor = "current_thread")]
async fn a_storm_is_logged_on_entry_and_exit_under_the_sessions_hash() {
    let (logs, _guard) = Logs::capture();
    let g = SessionGuard::new(SessionConfig::default()).unwrap();
    let id = "runaway-session-id-chosen-by-the-client";
    let lines = |what: &str| logs.text().lines().filter(|l| l.contains(what)).count();
    assert!(g.accept(&SessionId::new(id), &stormgate::Tenant::anonymous()));
    // A diverse, failing runaway.
    for i in 0..60 {
        let c = Call::request("tools/call")
            .with_tool("search")
            .with_session(SessionId::new(id))
            .with_arguments(&json!({ "q": format!("query {i}") }).to_string());
        if g.admit(&c).is_ok() {
            observe(&g, &c, Outcome::Error, 900);
        }
        tokio::time::advance(Duration::from_millis(100)).await;
    }
    assert!(g.summary(&SessionId::new(id)).unwrap().factor < 0.5);
    assert_eq!(
        lines("session entered the storm state"),
        1,
        "{}",
        logs.text()
    );
    assert_eq!(lines("session left the storm state"), 0);
    // Then healthy, repetitive work until it is trusted again (at most ten minutes).
    let steady = Call::request("tools/call")
        .with_tool("search")
        .with_session(SessionId::new(id))
        .with_arguments(r#"{"q":"same"}"#);
    for _ in 0..1200 {
        if g.admit(&steady).is_ok() {
            observe(&g, &steady, Outcome::Ok, 5);
        }
        tokio::time::advance(Duration::from_millis(500)).await;
        if g.summary(&SessionId::new(id)).unwrap().factor >= 0.9 {
            break;
        }
    }
    assert!(g.summary(&SessionId::new(id)).unwrap().factor >= 0.9);
    assert_eq!(lines("session entered the storm state"), 1);
    assert_eq!(lines("session left the storm state"), 1, "{}", logs.text());
    assert!(!logs.text().contains(id), "the client's id is never logged");
    assert!(logs.text().contains("session=\""), "{}", logs.text());
}

#[tokio::test(start_paused = true, flavor = "current_thread")]
async fn a_budget_cut_and_its_recovery_are_a_few_lines_not_one_per_tick() {
    let (logs, _guard) = Logs::capture();
    let budget = Budget::builder(BudgetConfig::default()).build();
    let call = Call::request("tools/call").with_tool("x");
    let lines = |what: &str| logs.text().lines().filter(|l| l.contains(what)).count();
    // Three seconds of failures, ten ticks a second: the budget falls to its floor.
    for _ in 0..30 {
        for _ in 0..10 {
            observe(budget.observer().as_ref(), &call, Outcome::Error, 10);
        }
        budget.tick();
        tokio::time::advance(Duration::from_millis(100)).await;
    }
    assert!(budget.current() < 500.0);
    assert_eq!(lines("global budget cut"), 1, "{}", logs.text());
    // Then healthy until back at stable.
    for _ in 0..600 {
        for _ in 0..10 {
            observe(budget.observer().as_ref(), &call, Outcome::Ok, 10);
        }
        budget.tick();
        tokio::time::advance(Duration::from_millis(100)).await;
    }
    assert_eq!(budget.current(), 1000.0);
    assert_eq!(lines("global budget recovering"), 1, "{}", logs.text());
    assert_eq!(lines("global budget back at stable"), 1, "{}", logs.text());
    assert_eq!(lines("global budget"), 3);
}
