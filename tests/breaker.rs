//! Per-tool circuit breakers, paused time: the full cycle, isolation between tools, and
//! stormgate's own refusals never counting as the tool's failures.

mod common;

#[path = "../examples/mcp_server/app.rs"]
mod app;

use std::num::NonZeroUsize;
use std::time::Duration;

use common::{message, session, tool_call};
use serde_json::json;
use stormgate::admit::Admission;
use stormgate::breaker::{BreakerConfig, BreakerState, CircuitBreakers};
use stormgate::control::Config;
use stormgate::fifo::ResourceLimits;
use stormgate::outcome::{Observation, Observer, Outcome};
use stormgate::{Call, Reason, Scope, SessionId};
use tower::ServiceExt;

fn breakers() -> CircuitBreakers {
    CircuitBreakers::new({
        let mut built = BreakerConfig::default();
        built.tools = ["search".to_owned(), "sql".to_owned()]
            .into_iter()
            .collect();
        built
    })
    .unwrap()
}

/// A call of `tool` by client `client` (its session) ended with `outcome`.
fn ran(b: &CircuitBreakers, tool: &str, outcome: Outcome, client: usize) {
    let call = Call::request("tools/call")
        .with_tool(tool)
        .with_session(SessionId::new(format!("client-{client}")));
    b.observe(&Observation {
        call: &call,
        outcome,
        service_time: Duration::from_millis(20),
        response_bytes: 10,
        queue_wait: Duration::ZERO,
        at: tokio::time::Instant::now(),
    });
}

#[tokio::test(start_paused = true)]
async fn opens_refuses_probes_closes_and_reopens_per_tool() {
    let b = breakers();
    let search = Call::request("tools/call").with_tool("search");
    let sql = Call::request("tools/call").with_tool("sql");
    let other = Call::request("tools/call").with_tool("cache");
    for i in 0..10 {
        b.admit(&search).unwrap();
        ran(&b, "search", Outcome::Error, i % 2);
    }
    assert!(matches!(b.state("search"), Some(BreakerState::Open { .. })));
    let err = b.admit(&search).unwrap_err();
    assert_eq!(
        (err.reason(), err.scope()),
        (Reason::CircuitOpen, Scope::Tool)
    );
    assert_eq!(
        err.retry_after(),
        Duration::from_secs(10),
        "until the first probe"
    );
    tokio::time::advance(Duration::from_secs(4)).await;
    assert_eq!(
        b.admit(&search).unwrap_err().retry_after(),
        Duration::from_secs(6)
    );
    // Another tool's breaker, and an unprotected tool, are not affected.
    assert!(b.admit(&sql).is_ok());
    assert!(b.admit(&other).is_ok());
    assert_eq!(b.state("cache"), None);

    // Half-open: exactly two probes.
    tokio::time::advance(Duration::from_secs(6)).await;
    let probes: Vec<_> = (0..2).map(|_| b.admit(&search).unwrap()).collect();
    assert!(b.admit(&search).is_err(), "a third call is not a probe");
    drop(probes);
    ran(&b, "search", Outcome::Ok, 0);
    ran(&b, "search", Outcome::Ok, 1);
    assert_eq!(b.state("search"), Some(BreakerState::Closed));

    // Open again; a failed probe reopens it for the whole wait.
    for i in 0..10 {
        ran(&b, "search", Outcome::Timeout, i % 3);
    }
    tokio::time::advance(Duration::from_secs(10)).await;
    b.admit(&search).unwrap();
    ran(&b, "search", Outcome::Error, 0);
    assert_eq!(
        b.admit(&search).unwrap_err().retry_after(),
        Duration::from_secs(10)
    );
}

#[tokio::test(start_paused = true)]
async fn a_probe_refused_downstream_gives_its_place_back() {
    let b = breakers();
    let search = Call::request("tools/call").with_tool("search");
    for i in 0..10 {
        ran(&b, "search", Outcome::Error, i % 2);
    }
    tokio::time::advance(Duration::from_secs(10)).await;
    let first = b.admit(&search).unwrap();
    let _second = b.admit(&search).unwrap();
    assert!(b.admit(&search).is_err());
    b.refund(first); // a later stage refused it: it never ran
    assert!(b.admit(&search).is_ok(), "the place is free again");
}

#[tokio::test(start_paused = true)]
async fn stormgate_refusals_never_count_as_the_tools_failures() {
    // sql_scan behind a breaker and a FIFO key that refuses all but one call at a time.
    let mut config = Config::default();
    config.breaker.tools.insert("sql_scan".into());
    config.fifo.keys.insert(
        "sql_scan".into(),
        ResourceLimits::default()
            .max_concurrent(NonZeroUsize::MIN)
            .max_queue_depth(0),
    );
    let (router, control) = app::protected(app::Backend::new(), config).unwrap();
    let sid = session(&router).await;
    let calls: Vec<_> = (0..30)
        .map(|i| {
            let r = router.clone();
            let req = tool_call(&sid, i, "sql_scan", json!({"table": "t"}));
            tokio::spawn(async move { message(r.oneshot(req).await.unwrap()).await.0 })
        })
        .collect();
    let mut refused = 0;
    for c in calls {
        if c.await.unwrap()["error"]["data"]["reason"] == "queue_full" {
            refused += 1;
        }
    }
    assert!(refused >= 20, "{refused} refused by the FIFO limiter");
    assert_eq!(
        control.breakers().state("sql_scan"),
        Some(BreakerState::Closed)
    );
}

#[tokio::test(start_paused = true)]
async fn one_clients_failures_do_not_open_the_breaker_for_everyone() {
    let b = breakers();
    for _ in 0..100 {
        ran(&b, "search", Outcome::Error, 0);
    }
    assert_eq!(b.state("search"), Some(BreakerState::Closed));
    let other = Call::request("tools/call")
        .with_tool("search")
        .with_session(SessionId::new("client-1"));
    assert!(b.admit(&other).is_ok());
    // Failures from a second client too: the tool is failing, not the client.
    ran(&b, "search", Outcome::Error, 1);
    assert!(matches!(b.state("search"), Some(BreakerState::Open { .. })));
}
