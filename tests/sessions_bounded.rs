//! Bounded session state: a million idle sessions are all swept after the TTL, the cap holds
//! at insert time, a busy session survives a flood of accepted sessions, and ids the server
//! never accepted are not stored at all.

use std::time::Duration;
use stormgate::valid::{AtLeastOne, NonZeroDuration, Positive};

use stormgate::admit::Admission;
use stormgate::entropy::{SessionConfig, SessionGuard};
use stormgate::{Call, SessionId, Tenant};

/// Accepts `session` as the server would (it answered a call on it).
fn accept(g: &SessionGuard, session: &str) -> bool {
    g.accept(&SessionId::new(session), &Tenant::anonymous())
}

fn call(session: &str) -> Call {
    Call::request("tools/call")
        .with_tool("search")
        .with_session(SessionId::new(session))
        .with_arguments(r#"{"q":"x"}"#)
}

#[tokio::test(start_paused = true)]
async fn a_million_idle_sessions_are_all_swept_after_the_ttl() {
    let g = SessionGuard::new({
        let mut built = SessionConfig::default();
        built.max_sessions = std::num::NonZeroUsize::new(1_000_000).unwrap();
        built.new_session_burst = AtLeastOne::new(2e6).unwrap();
        built.idle_ttl = NonZeroDuration::new(Duration::from_secs(300)).unwrap();
        built
    })
    .unwrap();
    for i in 0..1_000_000 {
        assert!(accept(&g, &format!("s{i}")));
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
    let g = SessionGuard::new({
        let mut built = SessionConfig::default();
        built.max_sessions = std::num::NonZeroUsize::new(1000).unwrap();
        built.idle_ttl = NonZeroDuration::new(Duration::from_secs(60)).unwrap();
        built.base_budget = Positive::new(1000.0).unwrap();
        built.burst = Positive::new(1000.0).unwrap();
        built.new_session_burst = AtLeastOne::new(1e6).unwrap();
        built
    })
    .unwrap();
    let busy = call("busy");
    assert!(accept(&g, "busy"));
    g.admit(&busy).unwrap();
    for i in 0..100_000 {
        accept(&g, &format!("random-{i}"));
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

#[tokio::test(start_paused = true)]
async fn ids_the_server_never_accepted_are_not_stored() {
    let g = SessionGuard::new(SessionConfig::default()).unwrap();
    assert!(accept(&g, "real"));
    for i in 0..200_000 {
        let _ = g.admit(&call(&format!("random-{i}")));
    }
    assert_eq!(g.len(), 1, "only the accepted session");
    assert_eq!(g.pools(), 1, "the flood is one pool: its tenant's");
    assert!(g.summary(&SessionId::new("random-7")).is_none());
    assert_eq!(
        g.unverified(&Tenant::anonymous()).unwrap().calls,
        200_000,
        "every call of the flood was charged to the pool"
    );
}

#[tokio::test(start_paused = true)]
async fn a_tenant_starts_new_sessions_at_its_newcomer_rate() {
    let g = SessionGuard::new({
        let mut built = SessionConfig::default();
        built.new_session_burst = AtLeastOne::new(10.0).unwrap();
        built.new_session_rate = Positive::new(0.2).unwrap();
        built
    })
    .unwrap();
    let accepted = (0..100).filter(|i| accept(&g, &format!("n{i}"))).count();
    assert_eq!(accepted, 10, "the allowance");
    tokio::time::advance(Duration::from_secs(5)).await;
    let accepted = (100..200).filter(|i| accept(&g, &format!("n{i}"))).count();
    assert_eq!(accepted, 1, "one more per 5 s");
    let other = SessionId::new("elsewhere");
    assert!(
        g.accept(&other, &Tenant::new("other-tenant")),
        "another tenant's allowance is its own"
    );
}
