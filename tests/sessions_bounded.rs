//! Bounded session state: a million idle sessions are all swept after the TTL, the cap holds
//! at insert time, and a busy session survives a flood of random session ids.

use std::time::Duration;

use stormgate::admit::Admission;
use stormgate::entropy::{SessionConfig, SessionGuard};
use stormgate::{Call, SessionId};

fn call(session: &str) -> Call {
    Call::request("tools/call")
        .with_tool("search")
        .with_session(SessionId::new(session))
        .with_arguments(r#"{"q":"x"}"#)
}

#[tokio::test(start_paused = true)]
async fn a_million_idle_sessions_are_all_swept_after_the_ttl() {
    let g = SessionGuard::new(SessionConfig {
        max_sessions: 1_000_000,
        idle_ttl: Duration::from_secs(300),
        ..SessionConfig::default()
    })
    .unwrap();
    for i in 0..1_000_000 {
        g.admit(&call(&format!("s{i}"))).unwrap();
    }
    assert_eq!(g.len(), 1_000_000);
    tokio::time::advance(Duration::from_secs(299)).await;
    assert_eq!(g.sweep(), 0, "not idle long enough");
    tokio::time::advance(Duration::from_secs(1)).await;
    assert_eq!(g.sweep(), 1_000_000);
    assert!(g.is_empty());
}

#[tokio::test(start_paused = true)]
async fn the_cap_holds_and_a_busy_session_survives_a_flood() {
    let g = SessionGuard::new(SessionConfig {
        max_sessions: 1000,
        idle_ttl: Duration::from_secs(60),
        base_budget: 1000.0,
        burst: 1000.0,
        ..SessionConfig::default()
    })
    .unwrap();
    let busy = call("busy");
    g.admit(&busy).unwrap();
    for i in 0..100_000 {
        let _ = g.admit(&call(&format!("random-{i}")));
        if i % 1000 == 0 {
            tokio::time::advance(Duration::from_millis(500)).await;
            g.admit(&busy).unwrap(); // the busy session keeps working
            g.sweep();
        }
        assert!(g.len() <= 1000, "the cap holds at insert time");
    }
    // 50 s passed: the flood's first sessions are idle, the busy one is not.
    tokio::time::advance(Duration::from_secs(30)).await;
    g.admit(&busy).unwrap();
    g.sweep();
    assert!(
        g.summary(&SessionId::new("busy")).is_some(),
        "the busy session is tracked"
    );
    assert!(
        g.summary(&SessionId::new("random-5")).is_none(),
        "idle flood sessions are gone"
    );
}
